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
SELECT namespace_id, id, queue_name, owner_id, state, state_version, attempts,
  current_attempt_id, state_changed_at, stuck_at, available_at, deadline_at,
  concurrency_key_digest, cancel_requested, error
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
-- GET tasks?stuck=true&queue= lists. On ix_pulse_tasks_fair (namespace_id, queue_id,
-- state, ...): the queue's non-terminal tasks only.
SELECT COUNT(*) AS n
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
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

-- name: watchdog_sessions_of_queue
-- The live worker sessions taking work from one queue (ACTIVE, unexpired, the queue among
-- their declared queues) with the attempts each holds, for the stuck reason of a waiting
-- task; bounded. The attempts are counted on ix_pulse_attempts_session.
SELECT s.id, s.concurrency_keys, s.max_concurrency, s.node_id,
  (SELECT COUNT(*) FROM pulse_attempts a
   WHERE a.namespace_id = s.namespace_id AND a.session_id = s.id
     AND a.state IN ('OFFERED', 'RUNNING')) AS held
FROM pulse_worker_sessions s
WHERE s.namespace_id = %(namespace_id)s AND s.state = 'ACTIVE' AND s.expires_at > %(now)s
  AND JSON_CONTAINS(s.queues, JSON_QUOTE(%(queue)s))
LIMIT 1000

-- name: watchdog_key_holders
-- Who holds the concurrency keys of some waiting tasks: the key's limit row (unique by
-- digest) and the attempts holding its permits, with their tasks.
SELECT l.key_digest, l.held, l.max_permits, p.attempt_id, p.granted_at, a.task_id
FROM pulse_concurrency_limits l
LEFT JOIN pulse_permits p
  ON p.namespace_id = l.namespace_id AND p.kind = 'key' AND p.holder_ref = l.id
LEFT JOIN pulse_attempts a ON a.namespace_id = p.namespace_id AND a.id = p.attempt_id
WHERE l.namespace_id = %(namespace_id)s AND l.key_digest IN %(digests)s

-- name: watchdog_current_attempts
-- The current attempts of some offered or running tasks, with their session and worker
-- instance (who holds the work, and whether that session is still alive).
SELECT a.id, a.state, a.session_id, a.lease_expires_at, s.state AS session_state,
  s.expires_at AS session_expires_at, i.host, i.pid
FROM pulse_attempts a
LEFT JOIN pulse_worker_sessions s ON s.namespace_id = a.namespace_id AND s.id = a.session_id
LEFT JOIN pulse_worker_instances i ON i.namespace_id = s.namespace_id AND i.id = s.instance_id
WHERE a.namespace_id = %(namespace_id)s AND a.id IN %(ids)s
