-- Raw events as batch rows: one immutable row per (transaction, namespace, event type,
-- subject kind) listing every subject the transaction changed, instead of one row (and two
-- index entries) per subject. A node round that starts 60 tasks writes one row, not 60.
-- orbit_events keeps the rows written before this migration (history); nothing writes it
-- any more. Readers: orbit/events.py (subject_events, namespace_events).
-- Rules: docs/architecture.md (no foreign keys, named CHECKs, comments on every column).

CREATE TABLE orbit_event_batches (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the state changes',
  id BINARY(16) NOT NULL COMMENT 'Batch id',
  type VARCHAR(64) NOT NULL COMMENT 'Event type of every entry, e.g. task.started',
  subject_kind VARCHAR(32) NOT NULL COMMENT 'Kind of the changed resources, e.g. task, queue, schedule, instance',
  subjects INT UNSIGNED NOT NULL COMMENT 'Number of entries',
  entries MEDIUMTEXT NOT NULL COMMENT 'JSON array, one object per changed resource: subject_id (32 hex or null), request_id (when a request caused it), data (event details, platform metadata)',
  created_at DATETIME(6) NOT NULL COMMENT 'Time of the changes (UTC), the database clock of their transaction',
  PRIMARY KEY (namespace_id, id),
  KEY ix_orbit_event_batches_created (namespace_id, created_at),
  CONSTRAINT ck_orbit_event_batches_entries CHECK (JSON_VALID(entries)),
  CONSTRAINT ck_orbit_event_batches_subjects CHECK (subjects >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Raw immutable record of every state change, one row per transaction, namespace and event type';

CREATE TRIGGER trg_orbit_event_batches_no_update BEFORE UPDATE ON orbit_event_batches FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_event_batches is immutable';

CREATE TRIGGER trg_orbit_event_batches_no_delete BEFORE DELETE ON orbit_event_batches FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_event_batches is immutable'
