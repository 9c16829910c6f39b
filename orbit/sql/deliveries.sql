-- Deliveries (orbit_deliveries): one row per (subscription, result event) with its own lease,
-- proof digest and attempt budget. States: PENDING, LEASED, ACKED, EXHAUSTED
-- (docs/delivery-semantics.md draws the machine). Every query filters namespace_id first.
--
-- next_at is overloaded on purpose: for PENDING it is the earliest next hand-out (backoff),
-- for LEASED it equals lease_expires_at. So the one index ix_orbit_deliveries_due
-- (namespace_id, subscription_id, state, next_at, seq) answers both "what is due" and
-- "which leases expired", in hand-out order, without a sort.

-- name: delivery_insert_many
-- Plain placeholders only, so the driver sends one multi-row INSERT. No ON DUPLICATE KEY:
-- a duplicate (subscription, seq) means two pumps raced past the row lock, and the unique
-- key uq_orbit_deliveries_subscription_seq must fail the whole transaction.
INSERT INTO orbit_deliveries
  (namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
   lease_expires_at, next_at, acked_at, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(subscription_id)s, %(seq)s, %(event_id)s, %(state)s,
   %(proof_digest)s, %(attempts)s, %(budget)s, %(lease_expires_at)s, %(next_at)s,
   %(acked_at)s, %(revision)s, %(created_at)s, %(updated_at)s)

-- name: delivery_get
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: delivery_get_for_update
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: delivery_lock_keys
-- A node round's locking read: the deliveries of several namespaces by primary key, in
-- (namespace, id) order (two rounds never wait on each other in a cycle). The one
-- (namespace_id, id IN …) group written here becomes one group per namespace, OR-ed
-- (store.deliveries.expand_keys).
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE ((namespace_id = %s AND id IN (/*ids*/)))
ORDER BY namespace_id, id
FOR UPDATE

-- name: deliveries_ack
-- The acks of one node round in ONE statement: each row guarded by its own revision
-- (CASE id WHEN … THEN … END); the matched count must equal the rows.
UPDATE orbit_deliveries
SET state = 'ACKED', acked_at = %s, lease_expires_at = NULL,
  revision = revision + 1, updated_at = %s
WHERE ((namespace_id = %s AND id IN (/*ids*/))) AND state <> 'ACKED' AND revision = /*revisions*/

-- name: deliveries_lease
-- One hand-out's leases in ONE statement: a new proof digest per row (CASE id), one more
-- attempt, the lease; each row guarded by state, budget and its own revision.
UPDATE orbit_deliveries
SET state = 'LEASED', proof_digest = /*digests*/, attempts = attempts + 1,
  lease_expires_at = %s, next_at = %s, revision = revision + 1, updated_at = %s
WHERE ((namespace_id = %s AND id IN (/*ids*/)))
  AND state = 'PENDING' AND attempts < budget AND revision = /*revisions*/

-- name: delivery_count_leased
-- Deliveries handed out and not yet settled. Only the holder of the subscription row lock
-- adds to this set, so the count is exact for that holder. FORCE INDEX: an index-only
-- range over this subscription's LEASED entries. Left to itself the optimizer may take the
-- primary key's namespace_id prefix instead (its statistics of a young table say so) and
-- read every delivery of the namespace, ACKED history included: a cost that grows forever.
SELECT COUNT(*) AS n
FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_due)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED'

-- name: delivery_in_flight
-- A hand-out's in-flight count in ONE statement: delivery_count_leased's LEASED rows plus
-- the open slots of LEASED ranges (delivery_ranges.sql range_in_flight), each an index-only
-- range forced as there. Exact for the holder of the subscription row lock.
SELECT
  (SELECT COUNT(*)
   FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_due)
   WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
     AND state = 'LEASED')
  + (SELECT COALESCE(SUM(open_n), 0)
     FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
     WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
       AND state = 'LEASED') AS n

-- name: delivery_list_due_for_update
-- PENDING deliveries whose backoff has passed, oldest due first, then by sequence.
-- SKIP LOCKED: a row being acked or given budget right now is left for the next round.
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'PENDING' AND next_at <= %(now)s
ORDER BY next_at, seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: delivery_list_expired_for_update
-- LEASED deliveries whose lease has ended (next_at = lease_expires_at for LEASED rows).
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED' AND next_at <= %(now)s
ORDER BY next_at, seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: delivery_expired_exists
-- Cheap, non-locking probe used by the background sweep before it locks a subscription
-- (FORCE INDEX: see delivery_count_leased).
SELECT 1 AS found
FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_due)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED' AND next_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))
LIMIT 1

-- name: delivery_requeue_if_revision
-- Nack, lease expiry or release: back to PENDING at next_at, or EXHAUSTED when the budget
-- is spent. The proof digest is kept, so a late ack with the last proof still counts until
-- the next hand-out replaces it.
UPDATE orbit_deliveries
SET state = %(state)s, lease_expires_at = NULL, next_at = %(next_at)s,
  revision = revision + 1, updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: delivery_set_budget_if_revision
-- Operator budget: raises the budget (never lowers it) and revives an EXHAUSTED delivery.
-- Attempts are never reset: the history of what was tried stays.
UPDATE orbit_deliveries
SET budget = %(budget)s, state = %(state)s, next_at = %(next_at)s,
  revision = revision + 1, updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND %(budget)s >= budget

-- name: delivery_count_by_state
SELECT state, COUNT(*) AS n
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
GROUP BY state

-- name: delivery_count_open_by_state
-- Deliveries not yet done, by state (the ACKED history is left out: it only grows).
SELECT state, COUNT(*) AS n
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state IN ('PENDING', 'LEASED', 'EXHAUSTED')
GROUP BY state

-- name: delivery_list_page
-- History in sequence order after a cursor (uses uq_orbit_deliveries_subscription_seq).
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: delivery_list_page_by_state
-- History of one state in sequence order (uses ix_orbit_deliveries_state_seq).
SELECT namespace_id, id, subscription_id, seq, event_id, state, proof_digest, attempts, budget,
  lease_expires_at, next_at, acked_at, revision, created_at, updated_at
FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = %(state)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: delivery_event_list_by_seq
-- The frozen snapshots of the result events being handed out (immutable rows, plain read;
-- a locking read here would make other subscriptions' hand-outs skip these events).
SELECT namespace_id, seq, event_id, type, task_id, queue, kind, owner_id, state, result,
  error, attempts, finished_at, created_at
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq IN %(seqs)s

-- name: delivery_event_sizes_by_seq
-- The bytes of the stored result and error of each event a hand-out may hand out again (due
-- PENDING rows): the hand-out stops at its byte budget before it leases or reads them.
SELECT seq, COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(error), 0) AS page_bytes
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq IN %(seqs)s

-- name: delivery_event_scan_after
-- Result events after a subscription's cursor with the bytes of their result and error
-- (page_bytes) and the running total from the first (walk_bytes); result and error only while
-- the total is within max_bytes (inline = 1), so what this statement carries is bounded too.
-- The hand-out filters them and stops at its byte budget, then reads the chosen events that
-- came without their result (delivery_event_list_by_seq). The walk follows the gap-free seqs one primary-key step at a
-- time and stops at the first event that brings the total to max_bytes, so the server sizes
-- (reads) one budget of large results, not limit of them. Immutable rows, plain read.
WITH RECURSIVE walk (seq, page_bytes, walk_bytes, n) AS (
  SELECT seq, COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(error), 0),
    COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(error), 0), 1
  FROM orbit_result_events
  WHERE namespace_id = %(namespace_id)s AND seq = %(after_seq)s + 1
  UNION ALL
  SELECT e.seq, COALESCE(LENGTH(e.result), 0) + COALESCE(LENGTH(e.error), 0),
    w.walk_bytes + COALESCE(LENGTH(e.result), 0) + COALESCE(LENGTH(e.error), 0), w.n + 1
  FROM walk w
  JOIN orbit_result_events e ON e.namespace_id = %(namespace_id)s AND e.seq = w.seq + 1
  WHERE w.walk_bytes < %(max_bytes)s AND w.n < %(limit)s
)
SELECT r.namespace_id, r.seq, r.event_id, r.type, r.task_id, r.queue, r.kind, r.owner_id,
  r.state, r.attempts, r.finished_at, r.created_at, walk.page_bytes, walk.walk_bytes,
  IF(walk.walk_bytes <= %(max_bytes)s, r.result, NULL) AS result,
  IF(walk.walk_bytes <= %(max_bytes)s, r.error, NULL) AS error,
  walk.walk_bytes <= %(max_bytes)s AS inline
FROM walk
JOIN orbit_result_events r ON r.namespace_id = %(namespace_id)s AND r.seq = walk.seq
ORDER BY r.seq

-- name: delivery_lease_probe_many
-- The non-locking probe before a hand-out (orbit.delivery_pump.lease), for one or many
-- subscriptions in ONE statement (delivery_pump.LeaseProbes coalesces a node's consumers'):
-- each subscription, whether its cursor is behind the stream (new events to hand out),
-- whether a PENDING delivery is due or a lease has expired (a row's or a range's), and how
-- many are leased (LEASED rows plus open slots of LEASED ranges). When there is nothing to
-- hand out or reclaim, the hand-out ends here instead of locking the subscription row.
-- The one (namespace_id, id IN …) group written here becomes one group per namespace, OR-ed
-- (store.deliveries.expand_keys): primary-key ranges of orbit_subscriptions; the subqueries are index-only ranges.
SELECT s.namespace_id, s.id, s.name, s.filter, s.start_spec, s.after_seq, s.ack_timeout_ms,
  s.max_deliveries, s.max_in_flight, s.revision, s.created_at, s.updated_at,
  COALESCE(e.last_seq, 0) AS last_seq,
  EXISTS (SELECT 1 FROM orbit_deliveries d FORCE INDEX (ix_orbit_deliveries_due)
          WHERE d.namespace_id = s.namespace_id AND d.subscription_id = s.id
            AND d.state = 'PENDING' AND d.next_at <= UTC_TIMESTAMP(6)) AS due,
  EXISTS (SELECT 1 FROM orbit_deliveries d FORCE INDEX (ix_orbit_deliveries_due)
          WHERE d.namespace_id = s.namespace_id AND d.subscription_id = s.id
            AND d.state = 'LEASED' AND d.next_at <= UTC_TIMESTAMP(6))
    OR EXISTS (SELECT 1 FROM orbit_delivery_ranges r FORCE INDEX (ix_orbit_delivery_ranges_open)
          WHERE r.namespace_id = s.namespace_id AND r.subscription_id = s.id
            AND r.state = 'LEASED' AND r.lease_expires_at <= UTC_TIMESTAMP(6)) AS expired,
  (SELECT COUNT(*) FROM orbit_deliveries d FORCE INDEX (ix_orbit_deliveries_due)
   WHERE d.namespace_id = s.namespace_id AND d.subscription_id = s.id
     AND d.state = 'LEASED')
  + (SELECT COALESCE(SUM(r.open_n), 0)
     FROM orbit_delivery_ranges r FORCE INDEX (ix_orbit_delivery_ranges_open)
     WHERE r.namespace_id = s.namespace_id AND r.subscription_id = s.id
       AND r.state = 'LEASED') AS in_flight,
  (SELECT MIN(d.next_at) FROM orbit_deliveries d FORCE INDEX (ix_orbit_deliveries_due)
   WHERE d.namespace_id = s.namespace_id AND d.subscription_id = s.id
     AND d.state = 'PENDING') AS next_due,
  UTC_TIMESTAMP(6) AS db_now
FROM orbit_subscriptions s
LEFT JOIN orbit_event_streams e ON e.namespace_id = s.namespace_id
WHERE ((s.namespace_id = %s AND s.id IN (/*ids*/)))

-- name: delivery_min_open_seq
-- Retention: the oldest delivery of a subscription still in flight (PENDING or LEASED), on
-- ix_orbit_deliveries_state_seq; its result event and everything after it is kept.
SELECT MIN(seq) FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state IN ('PENDING', 'LEASED')

-- name: delivery_subscription_ids
-- Retention: the subscriptions (existing or deleted) that have delivery rows.
SELECT DISTINCT subscription_id FROM orbit_deliveries WHERE namespace_id = %(namespace_id)s

-- name: delivery_purge_upto
-- Retention: the delivery rows of purged result events (seq up to the purged mark).
DELETE FROM orbit_deliveries
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND seq <= %(upto_seq)s
