-- Re-running finished tasks (pulse_tasks; evidence in pulse_attempt_evidence): FAILED or
-- CANCELLED back to WAITING by an operator. Every query filters namespace_id first.

-- name: task_rerun_if_finished
-- FAILED or CANCELLED → WAITING for at least %(extra)s more attempts (the attempts made so
-- far, their evidence and the task's identity are kept; the next attempt is generation
-- attempts + 1). A deadline that has passed is dropped (the operator asked for a run).
-- 0 rows = the task changed since it was read (revision) or is not finished.
UPDATE pulse_tasks
SET state = 'WAITING',
  state_version = state_version + 1,
  max_attempts = GREATEST(max_attempts, attempts + %(extra)s),
  available_at = %(now)s,
  deadline_at = IF(deadline_at IS NOT NULL AND deadline_at <= %(now)s, NULL, deadline_at),
  result = NULL,
  error = NULL,
  resolution = %(resolution)s,
  cancel_requested = 0,
  effect_uncertain = 0,
  current_attempt_id = NULL,
  session_id = NULL,
  lease_expires_at = NULL,
  finished_at = NULL,
  state_changed_at = %(now)s,
  stuck_at = NULL,
  stuck_reason = NULL,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND state IN ('FAILED', 'CANCELLED')

-- name: task_rerun_candidates
-- A bulk re-run's next batch: finished tasks of the filter, oldest finish first after a
-- position (state_changed_at, id), read without locks (the caller locks them by id). On
-- ix_pulse_tasks_state_age (namespace_id, state, state_changed_at): a finished task's
-- state_changed_at is its finish time, so the time range is an index range and a task
-- re-run (WAITING again) leaves the range.
SELECT id, queue_id, owner_id, state, state_changed_at
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
WHERE namespace_id = %(namespace_id)s AND state IN %(states)s
  AND state_changed_at >= %(since)s AND state_changed_at < %(until)s
  AND (state_changed_at > %(after_t)s OR (state_changed_at = %(after_t)s AND id > %(after_id)s))
  AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
  AND (%(owner_id)s IS NULL OR owner_id = %(owner_id)s)
  AND (%(error_type)s IS NULL OR JSON_VALUE(error, '$.type') = %(error_type)s)
  AND source_kind <> 'workflow'
ORDER BY state_changed_at, id
LIMIT %(limit)s

-- name: task_rerun_count
-- How many tasks a bulk re-run would take (counting at most %(cap)s).
SELECT COUNT(*) AS n FROM (
  SELECT 1
  FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
  WHERE namespace_id = %(namespace_id)s AND state IN %(states)s
    AND state_changed_at >= %(since)s AND state_changed_at < %(until)s
    AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
    AND (%(kind)s IS NULL OR kind = %(kind)s)
    AND (%(owner_id)s IS NULL OR owner_id = %(owner_id)s)
    AND (%(error_type)s IS NULL OR JSON_VALUE(error, '$.type') = %(error_type)s)
    AND source_kind <> 'workflow'
  LIMIT %(cap)s
) matched
