-- 0009: delivery ranges. A hand-out of first-time deliveries writes ONE row per subscription
-- (orbit_delivery_ranges) instead of one orbit_deliveries row per (subscription, event);
-- orbit_deliveries keeps only the exceptions: deliveries that were nacked, whose lease
-- expired or whose connection closed, that were exhausted or given budget (materialised
-- with the same delivery id), and the rows written before this migration.
--
-- Compatibility: nothing is rewritten. Existing PENDING rows are handed out by the same
-- code path as any materialised exception (before new events); existing LEASED rows are
-- acked, nacked, released and reclaimed as before; ACKED and EXHAUSTED rows stay history.
-- orbit_subscriptions.after_seq keeps its meaning: every result event up to it has been
-- considered (handed out in a range, or not matched by the filter, or pumped into a row
-- before this migration); events after it are simply not handed out yet, so a subscription
-- created from "earliest" on a large namespace writes nothing until it is consumed.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE orbit_subscriptions
  MODIFY COLUMN after_seq BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Hand-out cursor: every result event up to this seq has been considered (handed out or not matched). Not part of revision';

CREATE TABLE orbit_delivery_ranges (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the subscription',
  id BINARY(16) NOT NULL COMMENT 'Range id (random); proofs of its deliveries carry it',
  subscription_id BINARY(16) NOT NULL COMMENT 'Subscription the deliveries belong to',
  id_bucket SMALLINT UNSIGNED NOT NULL COMMENT 'First two bytes of every delivery id of the range (random per range): finds a delivery by id',
  seq_lo BIGINT UNSIGNED NOT NULL COMMENT 'Smallest result event seq handed out in this range',
  seq_hi BIGINT UNSIGNED NOT NULL COMMENT 'Largest result event seq handed out in this range (ranges of a subscription never overlap)',
  n SMALLINT UNSIGNED NOT NULL COMMENT 'Deliveries (slots) in the range',
  seqs BLOB NOT NULL COMMENT 'Result event seq of each slot, 8 bytes big-endian each',
  event_ids BLOB NOT NULL COMMENT 'Result event id of each slot, 16 bytes each',
  delivery_ids BLOB NOT NULL COMMENT 'Delivery id of each slot (128-bit random, kept if it is materialised), 16 bytes each',
  proof_digests BLOB NOT NULL COMMENT 'SHA-256 of the one-time proof of each slot, 32 bytes each (never the proof)',
  acked_us BLOB NOT NULL COMMENT 'Ack time of each slot in microseconds since 1970 UTC, 8 bytes each, 0 while not acked here',
  moved VARBINARY(125) NOT NULL COMMENT 'Bitmap: slot materialised as an orbit_deliveries row (that row is then the truth)',
  open_n SMALLINT UNSIGNED NOT NULL COMMENT 'Slots neither acked nor moved: leased here',
  acked_n SMALLINT UNSIGNED NOT NULL COMMENT 'Slots acked here',
  state VARCHAR(16) NOT NULL COMMENT 'LEASED (a slot open), DONE (all acked) or RECLAIMED (none open, some moved)',
  budget INT UNSIGNED NOT NULL COMMENT 'Attempt budget of each slot (max_deliveries at the hand-out)',
  lease_expires_at DATETIME(6) NOT NULL COMMENT 'End of the lease of every open slot (database clock)',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped by every change',
  created_at DATETIME(6) NOT NULL COMMENT 'Hand-out time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last change time (UTC)',
  PRIMARY KEY (namespace_id, id),
  KEY ix_orbit_delivery_ranges_open (namespace_id, subscription_id, state, lease_expires_at),
  KEY ix_orbit_delivery_ranges_seq (namespace_id, subscription_id, seq_hi),
  KEY ix_orbit_delivery_ranges_bucket (namespace_id, id_bucket),
  CONSTRAINT ck_orbit_delivery_ranges_state CHECK (state IN ('LEASED', 'DONE', 'RECLAIMED')),
  CONSTRAINT ck_orbit_delivery_ranges_counts CHECK (
    n >= 1 AND open_n + acked_n <= n AND (state = 'LEASED') = (open_n > 0)),
  CONSTRAINT ck_orbit_delivery_ranges_seq CHECK (seq_lo >= 1 AND seq_lo <= seq_hi),
  CONSTRAINT ck_orbit_delivery_ranges_budget CHECK (budget >= 1),
  CONSTRAINT ck_orbit_delivery_ranges_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='One row per hand-out of first-time deliveries of a subscription: per-delivery ids, proof digests and acks packed';
