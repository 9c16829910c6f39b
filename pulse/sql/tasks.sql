-- Tasks (pulse_tasks) on the producer/operator side: submit, read, list, cancel, resolve,
-- deadline expiry. The attempt and evidence rows they touch are read and written by the
-- queries of attempts.sql.
-- Every query on a runtime table filters namespace_id first, except the documented
-- cross-namespace background scan task_expire_candidates.
-- {cols} in a query stands for the task_columns block (expanded when loaded).

-- name: task_columns
namespace_id, id, owner_id, queue_id, queue_name, kind, pipeline_version, dedup_key, payload,
  priority, available_at, dispatch_at, deadline_at, max_attempts, retry_backoff_initial_ms,
  retry_backoff_max_ms, retry_backoff_multiplier, retry_safe, concurrency_key,
  concurrency_key_digest, state, state_version, attempts, current_attempt_id, session_id,
  lease_expires_at, cancel_requested, effect_uncertain, result, error, resolution, source_kind,
  source_id, stuck_at, stuck_reason, created_at, state_changed_at, started_at, finished_at,
  revision, progress, progress_at, progress_generation, fairness_key

-- name: task_page_columns
created_at, id, LENGTH(payload) + COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(error), 0)
  + COALESCE(LENGTH(resolution), 0) + COALESCE(LENGTH(progress), 0) AS page_bytes

-- name: task_get
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: task_get_for_update
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: task_get_many
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s

-- name: task_get_many_for_update
-- Locks in primary-key order so two bulk operations never lock the same rows crosswise.
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
ORDER BY id
FOR UPDATE

-- name: task_get_by_identity
-- The task holding an identity: one primary-key read of pulse_task_identities, then of the
-- task.
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id = (
  SELECT i.task_id FROM pulse_task_identities i
  WHERE i.namespace_id = %(namespace_id)s AND i.owner_id = %(owner_id)s AND i.kind = %(kind)s
    AND i.pipeline_version = %(pipeline_version)s AND i.dedup_key = %(dedup_key)s)

-- name: identity_find_tasks
-- The tasks holding some of a batch's identities (primary-key reads); the tasks are then
-- read by id (task_get_many).
SELECT task_id FROM pulse_task_identities
WHERE namespace_id = %(namespace_id)s AND owner_id = %(owner_id)s
  AND (kind, pipeline_version, dedup_key) IN %(identities)s

-- name: identity_insert
-- The identities of the tasks of one submit that have a dedup key, inserted before the tasks
-- in the same transaction: a taken identity fails this statement (1062 on its primary key)
-- and nothing of it is written. Plain placeholders only, so executemany sends one
-- multi-row INSERT.
INSERT INTO pulse_task_identities
  (namespace_id, owner_id, kind, pipeline_version, dedup_key, task_id)
VALUES
  (%(namespace_id)s, %(owner_id)s, %(kind)s, %(pipeline_version)s, %(dedup_key)s, %(id)s)

-- name: identity_delete
-- Takes back the identity one submit just inserted for a task it did not insert after all
-- (a payload the server refused): a primary-key delete, guarded by the task id.
DELETE FROM pulse_task_identities
WHERE namespace_id = %(namespace_id)s AND owner_id = %(owner_id)s AND kind = %(kind)s
  AND pipeline_version = %(pipeline_version)s AND dedup_key = %(dedup_key)s
  AND task_id = %(id)s

-- name: task_insert
-- Plain placeholders only, so executemany sends one multi-row INSERT.
INSERT INTO pulse_tasks
  (namespace_id, id, owner_id, queue_id, queue_name, kind, pipeline_version, dedup_key,
   payload, priority, available_at, deadline_at, max_attempts, retry_backoff_initial_ms,
   retry_backoff_max_ms, retry_backoff_multiplier, retry_safe, concurrency_key,
   concurrency_key_digest, fairness_key, state, source_kind, source_id, created_at,
   state_changed_at)
VALUES
  (%(namespace_id)s, %(id)s, %(owner_id)s, %(queue_id)s, %(queue_name)s, %(kind)s,
   %(pipeline_version)s, %(dedup_key)s, %(payload)s, %(priority)s, %(available_at)s,
   %(deadline_at)s, %(max_attempts)s, %(retry_backoff_initial_ms)s, %(retry_backoff_max_ms)s,
   %(retry_backoff_multiplier)s, %(retry_safe)s, %(concurrency_key)s,
   %(concurrency_key_digest)s, %(fairness_key)s, %(state)s, %(source_kind)s, %(source_id)s,
   %(created_at)s, %(created_at)s)

-- name: task_insert_values
-- Batch submit: the head of one multi-row INSERT whose VALUES tuples are SQL literals built
-- by pulse.store.tasks.task_insert_literal (orbit/storage/literals.py), in this column
-- order; state_changed_at takes created_at (as in task_insert).
INSERT INTO pulse_tasks
  (namespace_id, id, owner_id, queue_id, queue_name, kind, pipeline_version, dedup_key,
   payload, priority, available_at, deadline_at, max_attempts, retry_backoff_initial_ms,
   retry_backoff_max_ms, retry_backoff_multiplier, retry_safe, concurrency_key,
   concurrency_key_digest, fairness_key, state, source_kind, source_id, created_at,
   state_changed_at)
VALUES

-- name: task_list
-- Filters are optional (NULL = any); keyset pagination on (created_at, id).
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s
  AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
  AND (%(state)s IS NULL OR state = %(state)s)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
  AND (%(owner_id)s IS NULL OR owner_id = %(owner_id)s)
  AND (%(dedup_key)s IS NULL OR dedup_key = %(dedup_key)s)
  AND (created_at > %(after_created_at)s
       OR (created_at = %(after_created_at)s AND id > %(after_id)s))
ORDER BY created_at, id
LIMIT %(limit)s

-- name: task_cancel_candidates_by_owner
-- Bulk cancel: not-yet-cancelled tasks of the filter (WAITING, LEASED, RUNNING without a
-- cancel request yet), read without locks; the caller locks them by id afterwards. The
-- state IN list is a range on the index named in the hint, so tasks finished by earlier
-- batches are never scanned again (without the hint the optimizer may pick a
-- cross-namespace index). By owner: the namespace's unfinished range of
-- ix_pulse_tasks_state_age, filtered by owner (a namespace's tasks are its application's, or
-- a few granted owners'); by queue: that queue's range of ix_pulse_tasks_fair.
SELECT id, queue_id, owner_id FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
WHERE namespace_id = %(namespace_id)s AND owner_id = %(owner_id)s
  AND state IN ('WAITING', 'LEASED', 'RUNNING')
  AND NOT (state = 'RUNNING' AND cancel_requested = 1)
  AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
LIMIT %(limit)s

-- name: task_cancel_candidates_by_queue
SELECT id, queue_id, owner_id FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
  AND state IN ('WAITING', 'LEASED', 'RUNNING')
  AND NOT (state = 'RUNNING' AND cancel_requested = 1)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
LIMIT %(limit)s

-- name: task_cancel_candidates_all
SELECT id, queue_id, owner_id FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
WHERE namespace_id = %(namespace_id)s
  AND state IN ('WAITING', 'LEASED', 'RUNNING')
  AND NOT (state = 'RUNNING' AND cancel_requested = 1)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
LIMIT %(limit)s

-- name: task_cancel_if_unstarted
-- WAITING or LEASED → CANCELLED. 0 rows = the task moved on (started, finished) meanwhile.
UPDATE pulse_tasks
SET state = 'CANCELLED',
  state_version = state_version + 1,
  current_attempt_id = NULL,
  session_id = NULL,
  lease_expires_at = NULL,
  error = %(error)s,
  finished_at = %(now)s,
  state_changed_at = %(now)s,
  stuck_at = NULL,
  stuck_reason = NULL,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state IN ('WAITING', 'LEASED')

-- name: task_request_cancel_if_running
-- RUNNING: ask the worker to stop. The state does not change (the worker reports).
UPDATE pulse_tasks
SET cancel_requested = 1,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state = 'RUNNING' AND cancel_requested = 0

-- name: task_resolve_retry_if_review
-- NEEDS_REVIEW → WAITING (one more attempt at least): history kept, uncertainty resolved.
UPDATE pulse_tasks
SET state = 'WAITING',
  state_version = state_version + 1,
  effect_uncertain = 0,
  cancel_requested = 0,
  current_attempt_id = NULL,
  session_id = NULL,
  lease_expires_at = NULL,
  max_attempts = GREATEST(max_attempts, attempts + 1),
  available_at = %(now)s,
  error = NULL,
  resolution = %(resolution)s,
  state_changed_at = %(now)s,
  stuck_at = NULL,
  stuck_reason = NULL,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state = 'NEEDS_REVIEW'

-- name: task_resolve_finish_if_review
-- NEEDS_REVIEW → SUCCEEDED (result) or FAILED (error) by an operator.
UPDATE pulse_tasks
SET state = %(state)s,
  state_version = state_version + 1,
  effect_uncertain = 0,
  current_attempt_id = NULL,
  session_id = NULL,
  lease_expires_at = NULL,
  result = %(result)s,
  error = %(error)s,
  resolution = %(resolution)s,
  finished_at = %(now)s,
  state_changed_at = %(now)s,
  stuck_at = NULL,
  stuck_reason = NULL,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state = 'NEEDS_REVIEW'

-- name: task_expire_candidates
-- Cross-namespace background scan (allow-listed): WAITING tasks past their deadline, from
-- the rows of pulse_task_deadlines whose deadline passed (ix_pulse_task_deadlines_due, one
-- primary-key read of the task each), read without locks. The range also holds the tasks
-- offered, running or in review past their deadline (at most what is in flight) until they
-- finish; finished ones are deleted by deadline_delete_many. The sweep then locks the usage
-- rows (lock order) and the tasks with task_lock_expired_many.
SELECT d.namespace_id, d.task_id AS id, t.queue_id, t.owner_id
FROM pulse_task_deadlines d FORCE INDEX (ix_pulse_task_deadlines_due)
JOIN pulse_tasks t ON t.namespace_id = d.namespace_id AND t.id = d.task_id
WHERE d.deadline_at <= %(now)s AND t.state = 'WAITING' AND t.deadline_at <= %(now)s
ORDER BY d.deadline_at
LIMIT %(limit)s

-- name: deadline_stale_rows
-- Cross-namespace background scan (allow-listed): deadline rows past their deadline whose
-- task is finished, gone (purged) or no longer has that deadline (a re-run drops a passed
-- one) — never needed again, as nothing gives a task a deadline after its submit.
SELECT d.namespace_id, d.task_id
FROM pulse_task_deadlines d FORCE INDEX (ix_pulse_task_deadlines_due)
LEFT JOIN pulse_tasks t ON t.namespace_id = d.namespace_id AND t.id = d.task_id
WHERE d.deadline_at <= %(now)s
  AND (t.id IS NULL OR t.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
       OR t.deadline_at IS NULL OR t.deadline_at <> d.deadline_at)
ORDER BY d.deadline_at
LIMIT %(limit)s

-- name: deadline_insert
-- The deadlines of the tasks of one submit that have one, inserted after the tasks in the
-- same transaction. Plain placeholders only, so executemany sends one multi-row INSERT.
INSERT INTO pulse_task_deadlines (namespace_id, task_id, deadline_at)
VALUES (%(namespace_id)s, %(id)s, %(deadline_at)s)

-- name: deadline_delete_many
-- The deadline rows deadline_stale_rows found, of one namespace (primary-key deletes; only
-- past deadlines).
DELETE FROM pulse_task_deadlines
WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s AND deadline_at <= %(now)s

-- name: task_lock_expired_many
-- Locks the candidates that are still WAITING past their deadline; SKIP LOCKED leaves the
-- ones another node (or a dispatcher) holds right now to that transaction.
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
  AND state = 'WAITING' AND deadline_at <= %(now)s
ORDER BY id
FOR UPDATE SKIP LOCKED

-- name: task_fail_deadline_if_waiting
UPDATE pulse_tasks
SET state = 'FAILED',
  state_version = state_version + 1,
  error = %(error)s,
  finished_at = %(now)s,
  state_changed_at = %(now)s,
  stuck_at = NULL,
  stuck_reason = NULL,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state = 'WAITING'

-- name: attempt_latest_for_task
SELECT id, generation FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
ORDER BY generation DESC, offered_at DESC, id DESC
LIMIT 1

-- name: task_purge_candidates
-- Retention purge (pulse/task_purge.py): finished tasks of one state whose state changed
-- before the cutoff, oldest first after the pass's cursor, on ix_pulse_tasks_state_age;
-- SKIP LOCKED so a re-run or another purge holding a row is simply passed over.
SELECT id, source_kind, state_changed_at
FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND state = %(state)s
  AND state_changed_at >= %(after_t)s AND state_changed_at < %(cutoff)s
  AND (state_changed_at > %(after_t)s OR id > %(after_id)s)
ORDER BY state_changed_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: identity_purge_for_tasks
-- Retention purge: the identities of the tasks chosen (before the tasks: found through
-- their rows, each a primary-key delete).
DELETE i FROM pulse_task_identities i
JOIN pulse_tasks t ON t.namespace_id = i.namespace_id AND t.owner_id = i.owner_id
  AND t.kind = i.kind AND t.pipeline_version = i.pipeline_version AND t.dedup_key = i.dedup_key
WHERE t.namespace_id = %(namespace_id)s AND t.id IN %(ids)s AND t.dedup_key IS NOT NULL
  AND t.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND i.task_id = t.id

-- name: task_purge_many
-- Retention purge: the tasks chosen (still finished: the rows are locked).
DELETE FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
  AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')

-- name: task_oldest_unfinished
-- Retention: the oldest unfinished task of the namespace (its events are kept).
SELECT MIN(created_at) FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')
