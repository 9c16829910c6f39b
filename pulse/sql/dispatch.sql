-- Dispatch (step 1 of two-step dispatch): the node dispatch round's look and claim, and the
-- usage locks and reservation counters it shares with the submit's offer (docs/dispatch.md).
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

-- name: application_reservations_add_within_limit
-- Add offered attempts to the owner's reservations unless that passes its max_reservations.
-- 0 rows: the row is missing (nothing to count) or the quota would be exceeded (the caller
-- holds the row locked and judged the quota on it, so only a missing row gives 0).
UPDATE orbit_application_resources
SET reservations = reservations + %(n)s
WHERE application_id = %(application_id)s
  AND (max_reservations IS NULL OR reservations + %(n)s <= max_reservations)

-- name: usage_lock_with_limits
-- The submit's offer's first locks (pulse.transitions.lock_usage's usage_lock_all, plus
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

-- The node dispatch round (pulse/dispatch_round.py): one look across every waiting session's
-- queues, then ONE transaction for every namespace of the node. Positional parameters only
-- (the store builds the look's steps, the UNION ALL parts and the key groups).
--
-- The look is a skip scan of ix_pulse_tasks_fair done by the client in ONE round trip per
-- batch of steps (a multi-statement: one SET statement per step of the walk but the last,
-- then one SELECT). Each step dives once per queue to the first subject after the one the
-- step before found, which it reads from a user variable set by an earlier statement: a
-- user variable is a constant for the statement that reads it, so the dive is a range
-- starting after that subject and reads one index entry. Inside one statement it cannot be
-- (measured on MariaDB 10.11, 100,000 tasks of one subject): a recursive CTE's dive runs as
-- a dependent subquery, planned once as a ref on (namespace_id, queue_id, state) with
-- `fair_subject > previous` as a filter, so every step reads the entries of every subject
-- before it; the server builds no range from an outer column in a subquery, and the
-- recursive part may have no LIMIT; and a GROUP BY fair_subject gets no loose index scan
-- ("not covering": fair_subject is a virtual column, its base columns are not in the
-- index). The queue's last subject (one dive from the end) tells when the walk is done.

-- name: round_look_dive
-- One queue's step of the walk: its first fairness subject with WAITING tasks after the
-- bound — one dive into ix_pulse_tasks_fair. The store replaces the marker by nothing (the
-- first subject), by a bound parameter (after a subject) or by the variable of the step
-- before, and assigns the result to the step's variable (SET @var = (dive)) or, for the
-- batch's last step, selects it in round_look_walked. Parameters: namespace, queue (, the
-- bound).
(SELECT x.fair_subject FROM pulse_tasks x FORCE INDEX (ix_pulse_tasks_fair)
 WHERE x.namespace_id = %s AND x.queue_id = %s AND x.state = 'WAITING' /*after*/
 ORDER BY x.fair_subject LIMIT 1)

-- name: round_look_top
-- One queue's last fairness subject with WAITING tasks: one dive from the end of its range
-- of ix_pulse_tasks_fair (the walk is done when it reaches it). Parameters: namespace, queue.
(SELECT x.fair_subject FROM pulse_tasks x FORCE INDEX (ix_pulse_tasks_fair)
 WHERE x.namespace_id = %s AND x.queue_id = %s AND x.state = 'WAITING'
 ORDER BY x.fair_subject DESC LIMIT 1)

-- name: round_look_walked
-- One step's subject of one queue (joined with UNION ALL in place of the marker of
-- round_look): the step's variable, or the batch's last step's dive (then with the queue's
-- last subject as `top`, else NULL). NULL when that queue's walk had ended. Parameters:
-- namespace, queue, the subject's (a dive's), the position n in the walk, top's (a dive's).
SELECT CAST(%s AS BINARY(16)) AS namespace_id, CAST(%s AS BINARY(16)) AS queue_id,
  CAST(/*subject*/ AS BINARY(16)) AS subject, CAST(%s AS UNSIGNED) AS n,
  CAST(/*top*/ AS BINARY(16)) AS top

-- name: round_look
-- The look's last statement: the subjects the steps found, each with its first task in
-- dispatch order (owner, dispatch_at, available_at: dives on the subject's range of
-- ix_pulse_tasks_fair) and the database clock. No lock: a hint of who has work and when;
-- the claims decide. Parameters: the pinned now (NULL: the clock), then the walked parts'.
SELECT s.namespace_id, s.queue_id, s.subject, s.n, s.top,
  (SELECT y.owner_id FROM pulse_tasks y FORCE INDEX (ix_pulse_tasks_fair)
   WHERE y.namespace_id = s.namespace_id AND y.queue_id = s.queue_id AND y.state = 'WAITING'
     AND y.fair_subject = s.subject
   ORDER BY y.dispatch_at, y.id LIMIT 1) AS owner_id,
  (SELECT y.dispatch_at FROM pulse_tasks y FORCE INDEX (ix_pulse_tasks_fair)
   WHERE y.namespace_id = s.namespace_id AND y.queue_id = s.queue_id AND y.state = 'WAITING'
     AND y.fair_subject = s.subject
   ORDER BY y.dispatch_at, y.id LIMIT 1) AS first_dispatch_at,
  (SELECT y.available_at FROM pulse_tasks y FORCE INDEX (ix_pulse_tasks_fair)
   WHERE y.namespace_id = s.namespace_id AND y.queue_id = s.queue_id AND y.state = 'WAITING'
     AND y.fair_subject = s.subject
   ORDER BY y.dispatch_at, y.id LIMIT 1) AS first_available_at,
  CAST(COALESCE(%s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM (/*walked*/) s
WHERE s.subject IS NOT NULL

-- name: round_sessions_lock
-- The round's first locks: the sessions of every namespace, in (namespace_id, id) order (the
-- session level comes first in the lock order), each with the attempts it holds (offered or
-- running: the flow-control count) and of those the offered ones not started yet (the offer
-- depth), scalar subqueries on ix_pulse_attempts_session, which a locking read never locks,
-- and the clock read once the locks are held.
-- First parameter: the pinned now (NULL: the database clock).
SELECT s.namespace_id, s.id, s.state, s.node_id, s.max_concurrency, s.concurrency_keys,
  s.expires_at,
  (SELECT COUNT(*) FROM pulse_attempts a
   WHERE a.namespace_id = s.namespace_id AND a.session_id = s.id
     AND a.state IN ('OFFERED', 'RUNNING')) AS held,
  (SELECT COUNT(*) FROM pulse_attempts a
   WHERE a.namespace_id = s.namespace_id AND a.session_id = s.id
     AND a.state = 'OFFERED') AS offered,
  CAST(COALESCE(%s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_worker_sessions s
WHERE /*keys s.namespace_id s.id*/
ORDER BY s.namespace_id, s.id
FOR UPDATE

-- name: round_gates
-- The namespace gates (queue_id = 16 zero bytes) and queue gates of the round's queues.
SELECT namespace_id, queue_id, paused
FROM pulse_execution_gates
WHERE /*keys namespace_id queue_id*/

-- name: round_usage_lock
-- usage_lock_with_limits for every namespace of the round: the owners' application rows
-- sorted by id, then the queues' usage rows sorted by (namespace, queue), in ONE statement,
-- with the limits the offers are capped by. Positional parameters: the application ids (the
-- IN list the store builds), then the queues' key groups.
(SELECT 'a' AS kind, NULL AS namespace_id, application_id AS id, reservations,
  active_attempts, max_reservations, max_active_attempts, NULL AS max_concurrency
 FROM orbit_application_resources
 WHERE application_id IN (/*apps*/)
 ORDER BY application_id
 FOR UPDATE)
UNION ALL
(SELECT 'q', u.namespace_id, u.queue_id, u.reservations, u.active_attempts, NULL, NULL,
  (SELECT q.max_concurrency FROM pulse_queues q
   WHERE q.namespace_id = u.namespace_id AND q.id = u.queue_id)
 FROM pulse_queue_usage u
 WHERE /*keys u.namespace_id u.queue_id*/
 ORDER BY u.namespace_id, u.queue_id
 FOR UPDATE)

-- name: round_claim_part
-- One part of the round's claim (the store joins them with UNION ALL, one per (namespace,
-- queue, fairness subject) in play): that subject's due tasks in dispatch order, a range of
-- ix_pulse_tasks_fair (another subject's backlog is never read), at most LIMIT, FOR UPDATE
-- SKIP LOCKED (a row another transaction holds is skipped, never waited for). Keyed tasks
-- only for a session that handles keys, while the key is not held. Parameters: namespace, queue, subject, now ×3, keys_ok,
-- limit.
(SELECT t.namespace_id, t.id, t.owner_id, t.queue_id, t.queue_name, t.kind, t.payload,
  t.priority, t.available_at, t.dispatch_at, t.deadline_at, t.concurrency_key,
  t.concurrency_key_digest, t.fairness_key, t.fair_subject, t.state, t.state_version,
  t.attempts, t.revision
 FROM pulse_tasks t FORCE INDEX (ix_pulse_tasks_fair)
 WHERE t.namespace_id = %s AND t.queue_id = %s AND t.state = 'WAITING' AND t.fair_subject = %s
   AND t.dispatch_at <= %s AND t.available_at <= %s
   AND (t.deadline_at IS NULL OR t.deadline_at > %s)
   AND (t.concurrency_key_digest IS NULL OR (%s = 1 AND (
     SELECT c.held >= c.max_permits
     FROM pulse_concurrency_limits c FORCE INDEX (uq_pulse_concurrency_limits_key)
     WHERE c.namespace_id = t.namespace_id AND c.key_digest = t.concurrency_key_digest
   ) IS NOT TRUE))
 ORDER BY t.dispatch_at, t.id
 LIMIT %s
 FOR UPDATE SKIP LOCKED)
