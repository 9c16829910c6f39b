-- Queues (pulse_queues), their live counters (pulse_queue_usage), execution gates
-- (pulse_execution_gates) and the owning application's usage counters
-- (orbit_application_resources, updated in the same transaction as the task change).
-- Every query on a runtime table filters namespace_id first.

-- name: queue_get_by_name
SELECT namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
  lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
  retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
  stuck_after_ms, revision, created_at, updated_at
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: queue_get_by_name_clock
-- queue_get_by_name and the database clock (a submit's stamp: no statement of its own).
SELECT namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
  lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
  retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
  stuck_after_ms, revision, created_at, updated_at, UTC_TIMESTAMP(6) AS db_now
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: queue_get_by_name_for_update
SELECT namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
  lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
  retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
  stuck_after_ms, revision, created_at, updated_at
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
FOR UPDATE

-- name: queue_get
SELECT namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
  lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
  retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
  stuck_after_ms, revision, created_at, updated_at
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: queue_insert
INSERT INTO pulse_queues
  (namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
   lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
   retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
   stuck_after_ms, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(name)s, %(max_unfinished_tasks)s, %(max_concurrency)s,
   %(max_starts_per_second)s, %(lease_ms)s, %(retry_max_attempts)s,
   %(retry_backoff_initial_ms)s, %(retry_backoff_max_ms)s, %(retry_backoff_multiplier)s,
   %(retry_bound_min_ms)s, %(retry_bound_max_ms)s, %(retry_bound_multiplier_max)s,
   %(stuck_after_ms)s, 1, %(now)s, %(now)s)

-- name: queue_update_if_revision
-- Replaces the configuration (PUT semantics) and bumps the revision. 0 rows = the revision
-- moved on (a concurrent update) or the queue is gone. Usage lives elsewhere: never reset.
UPDATE pulse_queues
SET max_unfinished_tasks = %(max_unfinished_tasks)s,
  max_concurrency = %(max_concurrency)s,
  max_starts_per_second = %(max_starts_per_second)s,
  lease_ms = %(lease_ms)s,
  retry_max_attempts = %(retry_max_attempts)s,
  retry_backoff_initial_ms = %(retry_backoff_initial_ms)s,
  retry_backoff_max_ms = %(retry_backoff_max_ms)s,
  retry_backoff_multiplier = %(retry_backoff_multiplier)s,
  retry_bound_min_ms = %(retry_bound_min_ms)s,
  retry_bound_max_ms = %(retry_bound_max_ms)s,
  retry_bound_multiplier_max = %(retry_bound_multiplier_max)s,
  stuck_after_ms = %(stuck_after_ms)s,
  revision = revision + 1,
  updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: queue_list_after
-- Queues by name after the cursor position, with gate and usage (no per-state counts).
SELECT q.namespace_id, q.id, q.name, q.max_unfinished_tasks, q.max_concurrency,
  q.max_starts_per_second, q.lease_ms, q.retry_max_attempts, q.retry_backoff_initial_ms,
  q.retry_backoff_max_ms, q.retry_backoff_multiplier, q.retry_bound_min_ms,
  q.retry_bound_max_ms, q.retry_bound_multiplier_max, q.stuck_after_ms, q.revision,
  q.created_at, q.updated_at
FROM pulse_queues q
WHERE q.namespace_id = %(namespace_id)s AND q.name > %(after_name)s
ORDER BY q.name
LIMIT %(limit)s

-- name: queue_count_by_state
-- Live counts by state on ix_pulse_tasks_fair (namespace_id, queue_id, state, ...).
SELECT state, COUNT(*) AS n
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
GROUP BY state

-- name: usage_insert
INSERT INTO pulse_queue_usage (namespace_id, queue_id)
VALUES (%(namespace_id)s, %(queue_id)s)

-- name: usage_get
SELECT namespace_id, queue_id, unfinished_tasks, reservations, active_attempts, window_start,
  window_starts, denials_quota, denials_permits, denials_rate, denials_key,
  denials_application
FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: usage_get_many
SELECT namespace_id, queue_id, unfinished_tasks, reservations, active_attempts, window_start,
  window_starts, denials_quota, denials_permits, denials_rate, denials_key,
  denials_application
FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s

-- name: usage_lock
-- Lock order: after the application's resources row, before any task of the queue.
SELECT namespace_id, queue_id, unfinished_tasks, reservations, active_attempts, window_start,
  window_starts, denials_quota, denials_permits, denials_rate, denials_key,
  denials_application
FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
FOR UPDATE

-- name: usage_add
-- Deltas may be negative; an UNSIGNED column going below zero fails the statement (a counter
-- drift is a bug to surface, never to clamp).
UPDATE pulse_queue_usage
SET unfinished_tasks = unfinished_tasks + %(unfinished)s,
  reservations = reservations + %(reservations)s,
  active_attempts = active_attempts + %(active)s
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: usage_add_quota_denials
UPDATE pulse_queue_usage
SET denials_quota = denials_quota + %(n)s
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: gate_get_many
-- The namespace gate (queue_id = 16 zero bytes) and the queue gates asked for.
SELECT namespace_id, id, queue_id, paused, control_revision, updated_at
FROM pulse_execution_gates
WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s

-- name: gate_lock
-- The gate of one scope, locked: pause/resume decide "does this change anything" under it,
-- so two concurrent pauses write one change (one event, one audit row), never two.
SELECT namespace_id, id, queue_id, paused, control_revision, updated_at
FROM pulse_execution_gates
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
FOR UPDATE

-- name: gate_insert
-- First pause/resume of a scope. A concurrent first change of the same scope waits on
-- uq_pulse_execution_gates_scope and then fails with 1062: the caller locks the winner's row
-- and decides again.
INSERT INTO pulse_execution_gates
  (namespace_id, id, queue_id, paused, control_revision, updated_at)
VALUES (%(namespace_id)s, %(id)s, %(queue_id)s, %(paused)s, 1, %(now)s)

-- name: gate_set
-- Creates the gate on first use. control_revision moves only when paused changes (pause and
-- resume are idempotent); it is assigned before paused so it compares the old value.
INSERT INTO pulse_execution_gates
  (namespace_id, id, queue_id, paused, control_revision, updated_at)
VALUES (%(namespace_id)s, %(id)s, %(queue_id)s, %(paused)s, 1, %(now)s)
ON DUPLICATE KEY UPDATE
  control_revision = control_revision + IF(paused <> VALUES(paused), 1, 0),
  updated_at = IF(paused <> VALUES(paused), VALUES(updated_at), updated_at),
  paused = VALUES(paused)

-- name: gate_closed
-- 1 when the namespace gate or the queue's gate is paused (start authorisation).
SELECT COALESCE(MAX(paused), 0) AS closed
FROM pulse_execution_gates
WHERE namespace_id = %(namespace_id)s AND queue_id IN (%(zero_id)s, %(queue_id)s)

-- name: application_usage_add
-- Usage counters only: never the config revision (the row is created with its
-- application, so it counts every task from the start; going below zero violates
-- ck_orbit_application_resources_usage: a drift bug to surface, never to clamp).
UPDATE orbit_application_resources
SET unfinished_tasks = unfinished_tasks + %(unfinished)s,
  reservations = reservations + %(reservations)s,
  active_attempts = active_attempts + %(active)s
WHERE application_id = %(application_id)s

-- name: usage_lock_all
-- The lock order's first two steps in ONE round trip: the owners' application resources rows
-- (sorted by id), then the queues' usage rows (sorted by id). A UNION ALL runs its parts in
-- order and each part reads its primary key range in ascending order, so the locks are
-- taken exactly as the order says. ``kind`` tells the rows apart ('a' application,
-- 'q' queue); the queue rows carry no quota (NULL max_*: a queue's quota is on its row).
(SELECT 'a' AS kind, application_id AS id, unfinished_tasks, reservations, active_attempts,
  max_unfinished_tasks, max_reservations
 FROM orbit_application_resources
 WHERE application_id IN %(app_ids)s
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', queue_id, unfinished_tasks, reservations, active_attempts, NULL, NULL
 FROM pulse_queue_usage
 WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s
 ORDER BY queue_id
 FOR UPDATE)

-- name: usage_lock_apps
-- usage_lock_all without queues.
SELECT 'a' AS kind, application_id AS id, unfinished_tasks, reservations, active_attempts,
  max_unfinished_tasks, max_reservations
FROM orbit_application_resources
WHERE application_id IN %(app_ids)s
ORDER BY application_id
FOR UPDATE

-- name: usage_lock_queues
-- usage_lock_all without applications.
SELECT 'q' AS kind, queue_id AS id, unfinished_tasks, reservations, active_attempts,
  NULL AS max_unfinished_tasks, NULL AS max_reservations
FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s
ORDER BY queue_id
FOR UPDATE

-- name: usage_lock_keys
-- usage_lock_all for the queues of several namespaces (a node round): the owners'
-- application rows sorted by id, then the queues' usage rows sorted by (namespace, queue),
-- in ONE statement. Positional parameters: the application ids (the IN list the store
-- builds), then the queues' key groups.
(SELECT 'a' AS kind, NULL AS namespace_id, application_id AS id, unfinished_tasks,
  reservations, active_attempts, max_unfinished_tasks, max_reservations
 FROM orbit_application_resources
 WHERE application_id IN (/*apps*/)
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', namespace_id, queue_id, unfinished_tasks, reservations, active_attempts, NULL,
  NULL
 FROM pulse_queue_usage
 WHERE /*keys namespace_id queue_id*/
 ORDER BY namespace_id, queue_id
 FOR UPDATE)


-- name: queue_get_by_name_shared
-- The queue read under a shared lock: a queue delete (which locks the row FOR UPDATE) waits
-- for the transaction that names the queue (a schedule publish, a session), or runs first and
-- the reader then sees no queue.
SELECT namespace_id, id, name, max_unfinished_tasks, max_concurrency, max_starts_per_second,
  lease_ms, retry_max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms,
  retry_backoff_multiplier, retry_bound_min_ms, retry_bound_max_ms, retry_bound_multiplier_max,
  stuck_after_ms, revision, created_at, updated_at
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
LOCK IN SHARE MODE

-- name: queue_delete_if_revision
-- 0 rows = the revision moved on (the caller holds the row lock: never in practice).
DELETE FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: usage_delete
-- With its queue: a submit that read the queue before the delete then finds no usage row
-- and answers 404.
DELETE FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: gate_delete
DELETE FROM pulse_execution_gates
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
