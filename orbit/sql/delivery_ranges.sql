-- Delivery ranges (orbit_delivery_ranges): one row per hand-out of first-time deliveries of a
-- subscription, with per-slot delivery ids, event ids, proof digests and ack times packed
-- (orbit/delivery_ranges.py explains the layout). States: LEASED, DONE, RECLAIMED. Every
-- query filters namespace_id first. Statements of a node round that span namespaces are written
-- with one (namespace_id, id IN …) group that the store repeats per namespace, OR-ed
-- (store.deliveries.expand_keys); per-row values and guards are CASE id WHEN … THEN … END.

-- name: range_insert_many
INSERT INTO orbit_delivery_ranges
  (namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
   delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
   lease_expires_at, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(subscription_id)s, %(id_bucket)s, %(seq_lo)s, %(seq_hi)s,
   %(n)s, %(seqs)s, %(event_ids)s, %(delivery_ids)s, %(proof_digests)s, %(acked_us)s,
   %(moved)s, %(n)s, 0, 'LEASED', %(budget)s, %(lease_expires_at)s, 1, %(now)s, %(now)s)

-- name: range_lock_keys
-- Ranges of several namespaces by primary key, locked in (namespace, id) order; db_now:
-- the database clock once the row is locked (orbit.store.clock.clock_of).
SELECT namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
  delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
  lease_expires_at, revision, created_at, updated_at, SYSDATE(6) AS db_now
FROM orbit_delivery_ranges
WHERE ((namespace_id = %s AND id IN (/*ids*/)))
ORDER BY namespace_id, id
FOR UPDATE

-- name: range_update_many
-- The slot changes of one round (acks, moves) in ONE statement, each row guarded by its own
-- revision; the matched count must equal the rows.
UPDATE orbit_delivery_ranges
SET acked_us = /*acked_us*/, moved = /*moved*/, open_n = /*open_n*/, acked_n = /*acked_n*/,
  state = /*state*/, revision = revision + 1, updated_at = %s
WHERE ((namespace_id = %s AND id IN (/*ids*/))) AND revision = /*revisions*/

-- name: range_in_flight
-- Open slots of a subscription's LEASED ranges (index range of ix_orbit_delivery_ranges_open;
-- bounded by max_in_flight). Exact for the holder of the subscription row lock.
SELECT COALESCE(SUM(open_n), 0) AS n
FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED'

-- name: range_list_expired_for_update
-- LEASED ranges whose lease ended, oldest first. SKIP LOCKED: a range an ack round holds
-- right now is left for the next sweep, so the sweep never waits on (or deadlocks with) a
-- round that locks ranges in key order.
SELECT namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
  delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
  lease_expires_at, revision, created_at, updated_at
FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED' AND lease_expires_at <= %(now)s
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: range_expired_exists
SELECT 1 AS found
FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED' AND lease_expires_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))
LIMIT 1

-- name: range_list_by_bucket
-- Ranges whose delivery ids start with a bucket: where a delivery id may live (a delivery
-- found by its id alone). 1/65536 of the namespace's ranges.
SELECT namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
  delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
  lease_expires_at, revision, created_at, updated_at
FROM orbit_delivery_ranges
WHERE namespace_id = %(namespace_id)s AND id_bucket = %(id_bucket)s

-- name: range_list_page
-- History: a subscription's ranges after a seq, in seq order (ranges never overlap, so
-- seq_hi order is seq order).
SELECT namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
  delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
  lease_expires_at, revision, created_at, updated_at
FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_seq)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND seq_hi > %(after_seq)s
ORDER BY seq_hi
LIMIT %(limit)s

-- name: range_list_leased
-- A subscription's LEASED ranges (history filtered on LEASED; bounded by max_in_flight).
SELECT namespace_id, id, subscription_id, id_bucket, seq_lo, seq_hi, n, seqs, event_ids,
  delivery_ids, proof_digests, acked_us, moved, open_n, acked_n, state, budget,
  lease_expires_at, revision, created_at, updated_at
FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED' AND seq_hi > %(after_seq)s

-- name: range_counts
-- Backlog figures of a subscription's ranges: open slots of LEASED ranges, slots acked.
SELECT COALESCE(SUM(IF(state = 'LEASED', open_n, 0)), 0) AS open_n,
  COALESCE(SUM(acked_n), 0) AS acked_n
FROM orbit_delivery_ranges
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s

-- name: range_min_open_seq
-- Retention: the oldest hand-out of a subscription with a slot still leased.
SELECT MIN(seq_lo) FROM orbit_delivery_ranges
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND state = 'LEASED'

-- name: range_subscription_ids
SELECT DISTINCT subscription_id FROM orbit_delivery_ranges WHERE namespace_id = %(namespace_id)s

-- name: range_purge_upto
-- Retention: hand-outs whose every result event is purged (none leased: their seqs are at
-- or below the purge bound, which stops before any open slot).
DELETE FROM orbit_delivery_ranges
WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
  AND seq_hi <= %(upto_seq)s AND state <> 'LEASED'
