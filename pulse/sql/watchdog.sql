-- Stuck-work watchdog (pulse.watchdog): find tasks that stayed in one non-terminal state
-- longer than their queue's stuck_after_ms, mark them (stuck_at, stuck_reason) once per
-- state episode, and list/count the ones currently stuck.
--
-- A state episode is one stay in one state: every state change bumps state_version and sets
-- state_changed_at. A task is "surfaced in this episode" when
--   stuck_at >= state_changed_at AND stuck_reason LIKE CONCAT(state, ' %')
-- (the mark is later than the episode's start, and the reason the watchdog wrote starts with
-- the state it judged), so a state change needs no reset of the marks: the next episode
-- starts unsurfaced. The reason's state also covers a state change whose transaction read
-- the clock before the mark and wrote after it (state_changed_at a little older than
-- stuck_at): the new state differs from the reason's, so that episode is not surfaced yet.
-- Every query on pulse_tasks filters namespace_id first; watchdog_queue_list is the one
-- cross-namespace scan (of pulse_queues, keyset-paged, see its comment).
-- {cols} stands for the task_columns block of tasks.sql (expanded when loaded).

-- name: watchdog_queue_list
-- Queues with a stuck bound, every namespace, in (namespace_id, id) order after the keyset
-- position; bounded. A cross-namespace background scan (like recovery's lease scans): each
-- queue found is then worked on by its (namespace_id, id) key. pulse_queues holds
-- configuration only, so the scan is small and takes no locks.
SELECT namespace_id, id, name, stuck_after_ms
FROM pulse_queues
WHERE (namespace_id > %(after_namespace_id)s
       OR (namespace_id = %(after_namespace_id)s AND id > %(after_id)s))
  AND stuck_after_ms IS NOT NULL
ORDER BY namespace_id, id
LIMIT %(limit)s

-- name: watchdog_claim_overdue
-- Tasks of one queue in one state since before now - stuck_after_ms, not yet surfaced in
-- this episode, oldest first, locked with SKIP LOCKED so concurrent watchdogs (and busy
-- dispatch/start transactions) never wait on each other. The hint keeps the scan on the
-- (namespace_id, state, state_changed_at) range in index order, so LIMIT stops the scan and
-- only the returned rows stay locked (READ COMMITTED unlocks rows that fail the filter).
SELECT namespace_id, id, queue_name, state, state_version, attempts, current_attempt_id,
  state_changed_at, stuck_at
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
WHERE namespace_id = %(namespace_id)s
  AND state = %(state)s
  AND state_changed_at <= %(now)s - INTERVAL %(after_us)s MICROSECOND
  AND queue_id = %(queue_id)s
  AND NOT COALESCE(stuck_at >= state_changed_at AND stuck_reason LIKE CONCAT(state, ' %%'), 0)
ORDER BY state_changed_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: watchdog_mark_if_unsurfaced
-- Surface one claimed task. The guard is the episode itself: same state and state_version
-- as claimed, and not surfaced in it yet, so a second watchdog (or a retry) matches 0 rows
-- and writes no second event. The mark is an observation, not a change of the task: state,
-- state_version and revision stay as they are (a revision bump would fail the guarded
-- updates of workers and dispatchers that read the row before the mark).
UPDATE pulse_tasks
SET stuck_at = %(now)s,
  stuck_reason = %(reason)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
  AND state = %(state)s AND state_version = %(state_version)s
  AND NOT COALESCE(stuck_at >= state_changed_at AND stuck_reason LIKE CONCAT(state, ' %%'), 0)

-- name: watchdog_count_surfaced
-- Surfaced tasks of one queue still in their episode and still past the current bound, by
-- state (for the pulse_tasks_stuck gauge): the same index range as the claim, so the cost is
-- proportional to the queue's overdue tasks, never to its whole backlog.
SELECT state, COUNT(*) AS n
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_state_age)
WHERE namespace_id = %(namespace_id)s
  AND state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')
  AND state_changed_at <= %(now)s - INTERVAL %(after_us)s MICROSECOND
  AND queue_id = %(queue_id)s
  AND stuck_at >= state_changed_at AND stuck_reason LIKE CONCAT(state, ' %%')
GROUP BY state

-- name: watchdog_count_stuck_in_queue
-- Tasks of one queue currently stuck (surfaced and still in the same episode), whatever the
-- queue's bound is now: what GET queue shows as usage.stuck_tasks and what
-- GET tasks?stuck=true&queue= lists. On ix_pulse_tasks_dispatch (namespace_id, queue_id,
-- state, ...): the queue's non-terminal tasks only.
SELECT COUNT(*) AS n
FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
  AND state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')
  AND stuck_at >= state_changed_at AND stuck_reason LIKE CONCAT(state, ' %%')

-- name: watchdog_task_list
-- GET tasks with the stuck filter (plus every other filter; NULL = any), keyset pagination
-- on (created_at, id) like task_list. stuck = 1: currently stuck (non-terminal, surfaced in
-- this episode); stuck = 0: every other task.
SELECT {cols} FROM pulse_tasks
WHERE namespace_id = %(namespace_id)s
  AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
  AND (%(state)s IS NULL OR state = %(state)s)
  AND (%(kind)s IS NULL OR kind = %(kind)s)
  AND (%(owner_id)s IS NULL OR owner_id = %(owner_id)s)
  AND (%(dedup_key)s IS NULL OR dedup_key = %(dedup_key)s)
  AND (state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')
       AND COALESCE(stuck_at >= state_changed_at
                    AND stuck_reason LIKE CONCAT(state, ' %%'), 0)) = %(stuck)s
  AND (created_at > %(after_created_at)s
       OR (created_at = %(after_created_at)s AND id > %(after_id)s))
ORDER BY created_at, id
LIMIT %(limit)s
