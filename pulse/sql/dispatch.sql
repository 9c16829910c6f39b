-- Dispatch (step 1 of two-step dispatch): which owners have waiting work in a queue, and the
-- claims of due tasks, queue-wide or per owner (docs/dispatch.md).
--
-- "Due" = WAITING, available_at <= now (dispatch_at <= now is implied by it — priority only
-- moves dispatch_at earlier — but bounds the index range), not past its deadline, and keyed
-- only for a session that handles keys and only while the key is not held to its limit.
-- The key test is a scalar, non-locking subquery on pulse_concurrency_limits (a locking read
-- of the outer rows never locks the rows a subquery reads): the claim never waits on a
-- permit row and never takes a permit lock (permits come last in the lock order).
-- FORCE INDEX keeps each query on the index it is written for whatever the statistics say
-- (a flooding owner makes the optimizer guess wrong otherwise). %(now)s is never NULL here:
-- the dispatcher reads the database clock once per transaction (pulse.attempts.now_in_tx).

-- name: task_owner_next
-- The next owner (by id, after %(after)s; NULL: the first) with WAITING tasks in the queue,
-- with the dispatch_at of its first task: ONE dive into ix_pulse_tasks_owner_dispatch
-- (ORDER BY follows the index, LIMIT 1), whatever the backlog. The dispatcher walks the
-- owners with it (a skip scan by hand). Not a GROUP BY: MariaDB only plans that as a loose
-- index scan ("Using index for group-by") when the index statistics are fresh — right after
-- a bulk insert it read the whole backlog with a temporary table instead.
SELECT owner_id, dispatch_at AS first_dispatch_at
FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_owner_dispatch)
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s AND state = 'WAITING'
  AND (%(after)s IS NULL OR owner_id > %(after)s)
ORDER BY owner_id, dispatch_at
LIMIT 1

-- name: application_reservation_limits_many
-- Unlocked probe of the owners' reservation quotas (platform table, keyed by application):
-- a hint for which owners' rows the dispatcher must lock before it claims.
SELECT application_id, max_reservations
FROM orbit_application_resources
WHERE application_id IN %(ids)s

-- name: task_claim_due_in_queue
-- Queue-wide claim in dispatch order (one owner in play): ix_pulse_tasks_dispatch.
SELECT t.namespace_id, t.id, t.owner_id, t.queue_id, t.queue_name, t.kind, t.payload,
  t.priority, t.available_at, t.dispatch_at, t.deadline_at, t.concurrency_key,
  t.concurrency_key_digest, t.state, t.state_version, t.attempts, t.revision
FROM pulse_tasks t FORCE INDEX (ix_pulse_tasks_dispatch)
WHERE t.namespace_id = %(namespace_id)s AND t.queue_id = %(queue_id)s AND t.state = 'WAITING'
  AND t.dispatch_at <= %(now)s AND t.available_at <= %(now)s
  AND (t.deadline_at IS NULL OR t.deadline_at > %(now)s)
  AND (t.concurrency_key_digest IS NULL OR (%(keys_ok)s = 1 AND (
    SELECT c.held >= c.max_permits
    FROM pulse_concurrency_limits c FORCE INDEX (uq_pulse_concurrency_limits_key)
    WHERE c.namespace_id = %(namespace_id)s AND c.key_digest = t.concurrency_key_digest
  ) IS NOT TRUE))
ORDER BY t.dispatch_at, t.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: task_claim_due_for_owner
-- One owner's due tasks in dispatch order, after the (after_at, after_id) position (the last
-- task this transaction already claimed of that owner; NULL: from the start): a range of
-- ix_pulse_tasks_owner_dispatch, so another owner's backlog is never read.
SELECT t.namespace_id, t.id, t.owner_id, t.queue_id, t.queue_name, t.kind, t.payload,
  t.priority, t.available_at, t.dispatch_at, t.deadline_at, t.concurrency_key,
  t.concurrency_key_digest, t.state, t.state_version, t.attempts, t.revision
FROM pulse_tasks t FORCE INDEX (ix_pulse_tasks_owner_dispatch)
WHERE t.namespace_id = %(namespace_id)s AND t.queue_id = %(queue_id)s AND t.state = 'WAITING'
  AND t.owner_id = %(owner_id)s
  AND t.dispatch_at <= %(now)s AND t.available_at <= %(now)s
  AND (%(after_at)s IS NULL OR t.dispatch_at > %(after_at)s
    OR (t.dispatch_at = %(after_at)s AND t.id > %(after_id)s))
  AND (t.deadline_at IS NULL OR t.deadline_at > %(now)s)
  AND (t.concurrency_key_digest IS NULL OR (%(keys_ok)s = 1 AND (
    SELECT c.held >= c.max_permits
    FROM pulse_concurrency_limits c FORCE INDEX (uq_pulse_concurrency_limits_key)
    WHERE c.namespace_id = %(namespace_id)s AND c.key_digest = t.concurrency_key_digest
  ) IS NOT TRUE))
ORDER BY t.dispatch_at, t.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: application_reservations_add_within_limit
-- Add offered attempts to the owner's reservations unless that passes its max_reservations.
-- 0 rows: the row is missing (nothing to count) or the quota would be exceeded; the caller
-- tells them apart with application_reservation_limits_many and then locks the row first.
UPDATE orbit_application_resources
SET reservations = reservations + %(n)s
WHERE application_id = %(application_id)s
  AND (max_reservations IS NULL OR reservations + %(n)s <= max_reservations)

-- name: usage_lock_with_limits
-- The dispatch transaction's first locks (pulse.transitions.lock_usage's usage_lock_all, plus
-- the limits the offers are capped by): the owners' application resources rows sorted, then
-- the queues' usage rows sorted, in ONE statement (a UNION ALL runs its parts in order, each
-- a primary-key range read in ascending order: the lock order). Application rows carry
-- max_reservations and max_active_attempts; queue rows carry the queue's max_concurrency,
-- read by a scalar subquery on pulse_queues (a locking read of the outer rows never locks
-- the rows a subquery reads), so capping offers by permits costs no extra statement.
(SELECT 'a' AS kind, application_id AS id, unfinished_tasks, reservations, active_attempts,
  max_unfinished_tasks, max_reservations, max_active_attempts, NULL AS max_concurrency
 FROM orbit_application_resources
 WHERE application_id IN %(app_ids)s
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', u.queue_id, u.unfinished_tasks, u.reservations, u.active_attempts, NULL, NULL,
  NULL,
  (SELECT q.max_concurrency FROM pulse_queues q
   WHERE q.namespace_id = u.namespace_id AND q.id = u.queue_id)
 FROM pulse_queue_usage u
 WHERE u.namespace_id = %(namespace_id)s AND u.queue_id IN %(queue_ids)s
 ORDER BY u.queue_id
 FOR UPDATE)
