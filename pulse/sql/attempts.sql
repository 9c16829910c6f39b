-- Attempts (pulse_attempts, with the receipt of their applied report) and evidence
-- (pulse_attempt_evidence), plus the worker-side task transitions: lease (offer), start,
-- heartbeat, release, finish, retry, review.
--
-- Every task/attempt UPDATE is guarded (state, current attempt and revision) and bumps
-- revision, so its affected-row count (CLIENT.FOUND_ROWS) says whether the guard held.
-- Times are passed in as %(now)s, read once per transaction from the database clock after
-- the rows are locked. Every query filters namespace_id first, except the allow-listed
-- recovery scan attempt_list_expired (cross-namespace, on ix_pulse_attempts_lease).

-- name: task_lock
-- Lock order: after the application's and the queue's usage rows, before the attempt.
SELECT namespace_id, id, owner_id, queue_id, queue_name, kind, pipeline_version, dedup_key,
  payload, priority, available_at, dispatch_at, deadline_at, max_attempts,
  retry_backoff_initial_ms, retry_backoff_max_ms, retry_backoff_multiplier, retry_safe,
  concurrency_key, concurrency_key_digest, state, state_version, attempts, current_attempt_id,
  session_id, lease_expires_at, cancel_requested, effect_uncertain, result, error, resolution,
  source_kind, source_id, stuck_at, stuck_reason, created_at, state_changed_at, started_at,
  finished_at, revision
FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: task_lease_if_waiting
-- WAITING → LEASED for the new OFFERED attempt. 0 rows = the task moved on.
UPDATE pulse_tasks
SET state = 'LEASED', current_attempt_id = %(attempt_id)s, session_id = %(session_id)s,
  lease_expires_at = %(lease_expires_at)s, state_version = state_version + 1,
  state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'WAITING'
  AND revision = %(revision)s

-- name: task_start_if_leased
-- LEASED → RUNNING for its current attempt; attempts = the attempt's generation.
-- 0 rows = the task is no longer leased to this attempt (or its revision moved on).
UPDATE pulse_tasks
SET state = 'RUNNING', attempts = %(generation)s, started_at = %(now)s,
  lease_expires_at = %(lease_expires_at)s, state_version = state_version + 1,
  state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'LEASED'
  AND current_attempt_id = %(attempt_id)s AND revision = %(revision)s

-- name: task_release_if_leased
-- LEASED → WAITING (offer expired, denied or given back); attempts unchanged.
UPDATE pulse_tasks
SET state = 'WAITING', current_attempt_id = NULL, session_id = NULL, lease_expires_at = NULL,
  state_version = state_version + 1, state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'LEASED'
  AND current_attempt_id = %(attempt_id)s AND revision = %(revision)s

-- name: task_release_until_if_leased
-- LEASED → WAITING, not dispatched again before %(available_at)s (a start refused by a full
-- start-rate window waits for the window's end instead of being re-offered in a hot loop).
UPDATE pulse_tasks
SET state = 'WAITING', current_attempt_id = NULL, session_id = NULL, lease_expires_at = NULL,
  available_at = GREATEST(available_at, %(available_at)s),
  state_version = state_version + 1, state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'LEASED'
  AND current_attempt_id = %(attempt_id)s AND revision = %(revision)s

-- name: task_fail_if_leased
-- LEASED → FAILED at start authorisation (deadline passed); the offer is released.
UPDATE pulse_tasks
SET state = 'FAILED', error = %(error)s, finished_at = %(now)s, current_attempt_id = NULL,
  session_id = NULL, lease_expires_at = NULL, cancel_requested = 0, effect_uncertain = 0,
  state_version = state_version + 1, state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'LEASED'
  AND current_attempt_id = %(attempt_id)s AND revision = %(revision)s

-- name: task_end_run_if_running
-- RUNNING → SUCCEEDED / FAILED / CANCELLED (finished_at set), WAITING (retry at
-- available_at) or NEEDS_REVIEW (effect_uncertain = 1). Leaves no current attempt.
-- 0 rows = the task is not running this attempt any more (or its revision moved on).
UPDATE pulse_tasks
SET state = %(state)s, result = %(result)s, error = %(error)s, finished_at = %(finished_at)s,
  available_at = COALESCE(%(available_at)s, available_at),
  effect_uncertain = %(effect_uncertain)s, current_attempt_id = NULL, session_id = NULL,
  lease_expires_at = NULL, cancel_requested = 0, state_version = state_version + 1,
  state_changed_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'
  AND current_attempt_id = %(attempt_id)s AND revision = %(revision)s

-- name: task_heartbeat_if_running
-- Extends the task's mirror of the running attempt's lease. 0 rows = not running this
-- attempt, or the lease already expired (recovery decides; a heartbeat never revives).
UPDATE pulse_tasks
SET lease_expires_at = %(lease_expires_at)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'
  AND current_attempt_id = %(attempt_id)s AND lease_expires_at > %(now)s

-- name: attempt_insert_many
-- Placeholders only (state 'OFFERED' and revision 1 are parameters), so executemany sends
-- one multi-row INSERT instead of one statement per attempt.
INSERT INTO pulse_attempts
  (namespace_id, id, task_id, generation, session_id, state, lease_expires_at, offered_at,
   revision)
VALUES
  (%(namespace_id)s, %(id)s, %(task_id)s, %(generation)s, %(session_id)s, %(state)s,
   %(lease_expires_at)s, %(now)s, %(revision)s)

-- name: attempt_get
SELECT namespace_id, id, task_id, generation, session_id, state, execution_token_digest,
  concurrency_token, lease_expires_at, offered_at, started_at, finished_at, result, error,
  retryable, revision
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: attempt_lock
-- Also returns db_now: the decision's clock, read once the locks are held (%(now)s pins it).
SELECT namespace_id, id, task_id, generation, session_id, state, execution_token_digest,
  concurrency_token, lease_expires_at, offered_at, started_at, finished_at, result, error,
  retryable, revision, CAST(COALESCE(%(now)s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: attempt_peek
-- Unlocked read of what never changes (task, queue, owner): what to lock, in which order.
SELECT a.task_id, a.session_id, t.queue_id, t.owner_id
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.namespace_id = %(namespace_id)s AND a.id = %(id)s

-- name: start_context
-- The rest of what a start is judged by, in one read: the session's state and expiry, the
-- queue's lease and whether the namespace or queue gate is closed.
SELECT q.lease_ms, s.state AS session_state, s.expires_at AS session_expires_at,
  (SELECT COALESCE(MAX(g.paused), 0) FROM pulse_execution_gates g
   WHERE g.namespace_id = %(namespace_id)s AND g.queue_id IN (%(zero_id)s, %(queue_id)s))
   AS gate_closed
FROM pulse_queues q
LEFT JOIN pulse_worker_sessions s ON s.namespace_id = q.namespace_id AND s.id = %(session_id)s
WHERE q.namespace_id = %(namespace_id)s AND q.id = %(queue_id)s

-- name: attempt_start_if_offered
-- OFFERED → RUNNING with the execution token's digest and the running lease.
-- 0 rows = not offered any more (started, released) or its revision moved on.
UPDATE pulse_attempts
SET state = 'RUNNING', execution_token_digest = %(token_digest)s,
  concurrency_token = %(concurrency_token)s, lease_expires_at = %(lease_expires_at)s,
  started_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'OFFERED'
  AND revision = %(revision)s

-- name: attempt_release_if_offered
-- OFFERED → RELEASED: never started, so nothing can have happened. 0 rows = moved on.
UPDATE pulse_attempts
SET state = 'RELEASED', finished_at = %(now)s, error = %(error)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'OFFERED'
  AND revision = %(revision)s

-- name: attempt_finish_if_running
-- RUNNING → SUCCEEDED / FAILED / CANCELLED / LOST. 0 rows = not running any more.
UPDATE pulse_attempts
SET state = %(state)s, finished_at = %(now)s, result = %(result)s, error = %(error)s,
  retryable = %(retryable)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'
  AND revision = %(revision)s

-- name: attempt_heartbeat_if_running
-- 0 rows = not running, another session's, or its lease already expired.
UPDATE pulse_attempts
SET lease_expires_at = %(lease_expires_at)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'
  AND session_id = %(session_id)s AND lease_expires_at > %(now)s

-- name: attempt_heartbeat_view
-- What a heartbeat needs per attempt: the attempt, its task's state and cancel flag, and the
-- queue's lease length.
SELECT a.id, a.task_id, a.session_id, a.state, a.lease_expires_at,
  t.state AS task_state, t.current_attempt_id, t.cancel_requested, q.lease_ms
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
JOIN pulse_queues q ON q.namespace_id = t.namespace_id AND q.id = t.queue_id
WHERE a.namespace_id = %(namespace_id)s AND a.id IN %(ids)s

-- name: attempt_list_expired
-- Allow-listed cross-namespace recovery scan on ix_pulse_attempts_lease (state, lease).
SELECT namespace_id, id, task_id, state
FROM pulse_attempts
WHERE state = %(state)s AND lease_expires_at <= %(now)s
ORDER BY lease_expires_at
LIMIT %(limit)s

-- name: attempt_list_for_task
-- An offer released unstarted keeps its generation for the next offer, so a generation may
-- appear on several attempts (at most one of them started): offer time breaks the tie.
SELECT namespace_id, id, task_id, generation, session_id, state, execution_token_digest,
  concurrency_token, lease_expires_at, offered_at, started_at, finished_at, result, error,
  retryable, progress, progress_at, revision
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
ORDER BY generation, offered_at, id

-- name: evidence_insert
INSERT INTO pulse_attempt_evidence
  (namespace_id, id, attempt_id, task_id, kind, result, data, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(attempt_id)s, %(task_id)s, %(kind)s, %(result)s, %(data)s,
   %(now)s)

-- name: evidence_exists
-- A late report re-sent is recorded once: same attempt, kind and request digest.
SELECT 1 AS found
FROM pulse_attempt_evidence
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
  AND attempt_id = %(attempt_id)s AND kind = %(kind)s
  AND JSON_UNQUOTE(JSON_EXTRACT(data, '$.request_digest')) = %(request_digest)s
LIMIT 1

-- name: evidence_list_for_task
SELECT namespace_id, id, attempt_id, task_id, kind, result, data, created_at
FROM pulse_attempt_evidence
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
ORDER BY created_at, id

-- Batch forms (group commit of worker messages, pulse/batcher.py): the same reads as
-- attempt_peek / task_lock / attempt_lock / start_context / receipt_get_for_attempt for many
-- rows in one statement each. Locking reads take their rows in primary-key order.

-- name: attempt_peek_many
SELECT a.id, a.task_id, a.session_id, t.queue_id, t.owner_id, t.concurrency_key_digest
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.namespace_id = %(namespace_id)s AND a.id IN %(ids)s

-- name: task_lock_many
-- The columns the worker-side decisions and their events read (not the payload, the
-- resolution or the stuck marks: a batch of starts or reports never needs them, and the
-- payload is the widest column).
SELECT namespace_id, id, owner_id, queue_id, queue_name, kind, available_at, deadline_at,
  max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms, retry_backoff_multiplier,
  retry_safe, concurrency_key, concurrency_key_digest, state, state_version, attempts,
  current_attempt_id, session_id, lease_expires_at, cancel_requested, effect_uncertain,
  result, error, source_kind, source_id, started_at, finished_at, revision
FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
ORDER BY id
FOR UPDATE

-- name: attempt_lock_many
SELECT namespace_id, id, task_id, generation, session_id, state, execution_token_digest,
  concurrency_token, lease_expires_at, offered_at, started_at, finished_at, result, error,
  retryable, revision, CAST(COALESCE(%(now)s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
ORDER BY id
FOR UPDATE

-- name: session_state_many
SELECT id, state, expires_at
FROM pulse_worker_sessions
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s

-- name: queue_start_context_many
-- Per queue: its running lease and whether the namespace or the queue gate is closed.
SELECT q.id, q.lease_ms,
  (SELECT COALESCE(MAX(g.paused), 0) FROM pulse_execution_gates g
   WHERE g.namespace_id = %(namespace_id)s AND g.queue_id IN (%(zero_id)s, q.id))
   AS gate_closed
FROM pulse_queues q
WHERE q.namespace_id = %(namespace_id)s AND q.id IN %(ids)s

-- name: queue_start_limits_many
-- Unlocked probe: does any of these queues limit starts (permits or start rate)? Then the
-- start batch locks the usage rows first, before judging (see pulse/attempts.py).
SELECT id, (max_concurrency IS NOT NULL OR max_starts_per_second IS NOT NULL) AS limited
FROM pulse_queues
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s

-- name: application_start_limits_many
-- Unlocked probe of the owners' start quotas (platform table, keyed by application).
SELECT application_id AS id,
  (max_active_attempts IS NOT NULL OR max_starts_per_second IS NOT NULL
   OR max_reservations IS NOT NULL) AS limited
FROM orbit_application_resources
WHERE application_id IN %(ids)s

-- name: attempt_rotate_token_if_running
-- A re-sent `start` from the session that holds a RUNNING attempt (its `started` reply was
-- lost): a new execution token replaces the old one, which is stale from now on. 0 rows =
-- not running any more, another session's, its lease passed, or its revision moved on.
UPDATE pulse_attempts
SET execution_token_digest = %(token_digest)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'
  AND session_id = %(session_id)s AND lease_expires_at > %(now)s AND revision = %(revision)s

-- name: usage_lock_for_start
-- A start batch's first locks, in ONE statement (the lock order: the owners' application
-- rows sorted, then the queues' usage rows sorted — a UNION ALL runs its parts in order, each
-- a primary-key range read in ascending order), each row telling whether it limits starts:
-- the application's start quotas, or the queue's (read by a scalar subquery on
-- pulse_queues, which a locking read of the outer rows never locks). Replaces the unlocked
-- probes queue_start_limits_many / application_start_limits_many.
(SELECT 'a' AS kind, application_id AS id,
  (max_active_attempts IS NOT NULL OR max_starts_per_second IS NOT NULL
   OR max_reservations IS NOT NULL) AS limited
 FROM orbit_application_resources
 WHERE application_id IN %(app_ids)s
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', u.queue_id,
  (SELECT q.max_concurrency IS NOT NULL OR q.max_starts_per_second IS NOT NULL
   FROM pulse_queues q
   WHERE q.namespace_id = u.namespace_id AND q.id = u.queue_id)
 FROM pulse_queue_usage u
 WHERE u.namespace_id = %(namespace_id)s AND u.queue_id IN %(queue_ids)s
 ORDER BY u.queue_id
 FOR UPDATE)

-- name: attempt_peek_keys
-- Node rounds (pulse/start_round.py, pulse/report_round.py) use the *_keys queries: the
-- same reads and locks for the attempts of many namespaces in one statement. Their keys
-- marker becomes one (namespace_id = ? AND id IN (…)) group per namespace
-- (orbit/storage/keys.py); positional parameters only. Locking reads return (and lock)
-- rows in (namespace_id, id) order: a round's lock order is level by level across
-- namespaces, each level sorted.
SELECT a.namespace_id, a.id, a.task_id, a.session_id, t.queue_id, t.owner_id,
  t.concurrency_key_digest
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE /*keys a.namespace_id a.id*/

-- name: task_lock_keys
-- task_lock_many's columns, for tasks of many namespaces.
SELECT namespace_id, id, owner_id, queue_id, queue_name, kind, available_at, deadline_at,
  max_attempts, retry_backoff_initial_ms, retry_backoff_max_ms, retry_backoff_multiplier,
  retry_safe, concurrency_key, concurrency_key_digest, state, state_version, attempts,
  current_attempt_id, session_id, lease_expires_at, cancel_requested, effect_uncertain,
  result, error, source_kind, source_id, started_at, finished_at, revision
FROM pulse_tasks
WHERE /*keys namespace_id id*/
ORDER BY namespace_id, id
FOR UPDATE

-- name: attempt_lock_keys
-- attempt_lock_many for many namespaces; the first parameter is the pinned now (NULL: the
-- database clock, read once the locks are held).
SELECT namespace_id, id, task_id, generation, session_id, state, execution_token_digest,
  concurrency_token, lease_expires_at, offered_at, started_at, finished_at, result, error,
  retryable, receipt_id, receipt_op, receipt_digest, receipt_task_state, revision,
  CAST(COALESCE(%s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_attempts
WHERE /*keys namespace_id id*/
ORDER BY namespace_id, id
FOR UPDATE

-- name: session_state_keys
SELECT namespace_id, id, state, expires_at
FROM pulse_worker_sessions
WHERE /*keys namespace_id id*/

-- name: queue_start_context_keys
-- Per queue: its running lease and whether the namespace or the queue gate is closed.
SELECT q.namespace_id, q.id, q.lease_ms,
  (SELECT COALESCE(MAX(g.paused), 0) FROM pulse_execution_gates g
   WHERE g.namespace_id = q.namespace_id AND g.queue_id IN (%s, q.id)) AS gate_closed
FROM pulse_queues q
WHERE /*keys q.namespace_id q.id*/

-- name: usage_lock_for_start_keys
-- usage_lock_for_start for many namespaces: the owners' application rows (sorted), then the
-- queues' usage rows (sorted by namespace, queue), each telling whether it limits starts.
-- The first parameters are the application ids (the IN list the store builds).
(SELECT 'a' AS kind, NULL AS namespace_id, application_id AS id,
  (max_active_attempts IS NOT NULL OR max_starts_per_second IS NOT NULL
   OR max_reservations IS NOT NULL) AS limited
 FROM orbit_application_resources
 WHERE application_id IN (/*apps*/)
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', u.namespace_id, u.queue_id,
  (SELECT q.max_concurrency IS NOT NULL OR q.max_starts_per_second IS NOT NULL
   FROM pulse_queues q
   WHERE q.namespace_id = u.namespace_id AND q.id = u.queue_id)
 FROM pulse_queue_usage u
 WHERE /*keys u.namespace_id u.queue_id*/
 ORDER BY u.namespace_id, u.queue_id
 FOR UPDATE)

-- name: session_lock_keys
-- Heartbeat round: the sessions of many namespaces, locked in (namespace_id, id) order (the
-- session level comes first in the lock order), with the clock read once the locks are
-- held. First parameter: the pinned now (NULL: the database clock).
-- The session's credential and application are judged too (as a new request would be:
-- revoked or expired credential, disabled application), read by scalar subqueries, which a
-- locking read never locks.
SELECT s.namespace_id, s.id, s.instance_id, s.state, s.lease_ms, s.expires_at,
  (SELECT c.revoked_at IS NULL AND (c.expires_at IS NULL OR c.expires_at > COALESCE(%s, UTC_TIMESTAMP(6)))
   FROM orbit_credentials c WHERE c.id = s.credential_id) AS credential_ok,
  (SELECT a.status = 'active' FROM orbit_applications a WHERE a.id = s.application_id)
   AS application_ok,
  CAST(COALESCE(%s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_worker_sessions s
WHERE /*keys s.namespace_id s.id*/
ORDER BY s.namespace_id, s.id
FOR UPDATE

-- name: attempt_heartbeat_view_keys
-- attempt_heartbeat_view for the attempts of many namespaces (no lock: the round's guarded
-- UPDATEs decide, and a matched count below the rows makes it run again row by row).
SELECT a.namespace_id, a.id, a.task_id, a.session_id, a.state, a.lease_expires_at,
  t.state AS task_state, t.current_attempt_id, t.cancel_requested, q.lease_ms
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
JOIN pulse_queues q ON q.namespace_id = t.namespace_id AND q.id = t.queue_id
WHERE /*keys a.namespace_id a.id*/

-- name: attempt_tasks_in_flight
-- Retention purge: which of these tasks still have an attempt offered or running.
SELECT DISTINCT task_id FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s AND state IN ('OFFERED', 'RUNNING')

-- name: attempt_purge_for_tasks
-- Retention purge: every attempt (with its receipt columns) of purged tasks.
DELETE FROM pulse_attempts WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s

-- name: evidence_tasks_since
-- Retention purge: which of these tasks have evidence recorded at or after the cutoff (a
-- late report after the finish): those tasks wait until their evidence is old enough too.
SELECT DISTINCT task_id FROM pulse_attempt_evidence
WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s AND created_at >= %(cutoff)s

-- name: evidence_purge_for_tasks
-- Retention purge (with @orbit_retention_purge set; the delete trigger checks the age).
DELETE FROM pulse_attempt_evidence WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s
