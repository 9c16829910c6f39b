-- Retention: per-namespace windows after which history is purged (docs/operations.md
-- "Retention and purge"), and the delete triggers that let only the purge delete history,
-- and nothing younger than the namespace's window.
--
-- orbit_retention holds one row per namespace that has settings (a namespace without a row
-- keeps everything, as before). The purge loop (orbit/retention_purge.py) claims rows by
-- next_run_at and deletes in short, bounded transactions.
--
-- The immutable history tables keep their UPDATE triggers. Their DELETE triggers are
-- replaced: a delete is refused (1644, through orbit_history_guard, whose insert trigger
-- signals) unless the session set @orbit_retention_purge = 1 (only the purge does) AND the
-- row is older than the namespace's window for that kind of history, never less than the
-- floor below (the same minimum the API accepts). With no settings row, or a NULL window, the
-- condition is NULL and the delete is refused. The new trigger is created before the old
-- one is dropped, so no moment leaves a table unguarded.
--   orbit_event_batches, orbit_events, orbit_result_events: events_days (floor 1 day)
--   orbit_audit_events: audit_days (floor 7 days)
--   pulse_attempt_evidence: finished_tasks_days (floor 1 day)
-- Rules: docs/architecture.md (no foreign keys, named CHECKs, comments on every column).
-- Trigger bodies are single statements (no BEGIN ... END, see orbit/migrate/sqlsplit.py).

CREATE TABLE orbit_retention (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace the settings apply to',
  finished_tasks_days INT UNSIGNED NULL COMMENT 'Finished tasks (with attempts, receipts, evidence, effects) are purged this many days after they finished; NULL = kept forever',
  events_days INT UNSIGNED NULL COMMENT 'Raw events, result events and their deliveries are purged after this many days; NULL = kept forever',
  audit_days INT UNSIGNED NULL COMMENT 'Audit events are purged after this many days; NULL = kept forever',
  idempotency_hours INT UNSIGNED NULL COMMENT 'Idempotency-Key records of the namespace are remembered this many hours; NULL = the server default (24 h)',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'Config revision (ETag). Purge progress never bumps it',
  purged_total BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Progress: rows the purge deleted in this namespace so far',
  result_seq_purged BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Progress: every result event up to this seq has been purged (deliveries up to it go too)',
  last_run_at DATETIME(6) NULL COMMENT 'Progress: end of the last purge pass over the namespace (database clock)',
  next_run_at DATETIME(6) NOT NULL COMMENT 'The purge claims the namespace again at this time',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last settings update time (UTC)',
  PRIMARY KEY (namespace_id),
  KEY ix_orbit_retention_due (next_run_at),
  CONSTRAINT ck_orbit_retention_tasks CHECK (finished_tasks_days IS NULL OR finished_tasks_days BETWEEN 1 AND 36500),
  CONSTRAINT ck_orbit_retention_events CHECK (events_days IS NULL OR events_days BETWEEN 1 AND 36500),
  CONSTRAINT ck_orbit_retention_audit CHECK (audit_days IS NULL OR audit_days BETWEEN 7 AND 36500),
  CONSTRAINT ck_orbit_retention_idempotency CHECK (idempotency_hours IS NULL OR idempotency_hours BETWEEN 1 AND 720),
  CONSTRAINT ck_orbit_retention_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Per-namespace retention windows (revisioned settings) and the purge progress';

CREATE TABLE orbit_history_guard (
  refused_table VARCHAR(64) NOT NULL COMMENT 'History table whose delete was refused (never stored: the insert trigger signals)',
  PRIMARY KEY (refused_table)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Always empty: the delete triggers of history tables insert here to refuse a delete, and this table''s insert trigger signals 1644';

CREATE TRIGGER trg_orbit_history_guard_refuse BEFORE INSERT ON orbit_history_guard FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'history is immutable: only the retention purge deletes rows, once past the namespace window';

CREATE TRIGGER trg_orbit_event_batches_purge_only BEFORE DELETE ON orbit_event_batches FOR EACH ROW
  INSERT INTO orbit_history_guard (refused_table) SELECT 'orbit_event_batches' FROM DUAL
  WHERE (@orbit_retention_purge = 1 AND OLD.created_at < UTC_TIMESTAMP(6) - INTERVAL (
    SELECT GREATEST(r.events_days, 1) FROM orbit_retention r WHERE r.namespace_id = OLD.namespace_id
  ) DAY) IS NOT TRUE;

DROP TRIGGER trg_orbit_event_batches_no_delete;

CREATE TRIGGER trg_orbit_events_purge_only BEFORE DELETE ON orbit_events FOR EACH ROW
  INSERT INTO orbit_history_guard (refused_table) SELECT 'orbit_events' FROM DUAL
  WHERE (@orbit_retention_purge = 1 AND OLD.created_at < UTC_TIMESTAMP(6) - INTERVAL (
    SELECT GREATEST(r.events_days, 1) FROM orbit_retention r WHERE r.namespace_id = OLD.namespace_id
  ) DAY) IS NOT TRUE;

DROP TRIGGER trg_orbit_events_no_delete;

CREATE TRIGGER trg_orbit_result_events_purge_only BEFORE DELETE ON orbit_result_events FOR EACH ROW
  INSERT INTO orbit_history_guard (refused_table) SELECT 'orbit_result_events' FROM DUAL
  WHERE (@orbit_retention_purge = 1 AND OLD.created_at < UTC_TIMESTAMP(6) - INTERVAL (
    SELECT GREATEST(r.events_days, 1) FROM orbit_retention r WHERE r.namespace_id = OLD.namespace_id
  ) DAY) IS NOT TRUE;

DROP TRIGGER trg_orbit_result_events_no_delete;

CREATE TRIGGER trg_orbit_audit_events_purge_only BEFORE DELETE ON orbit_audit_events FOR EACH ROW
  INSERT INTO orbit_history_guard (refused_table) SELECT 'orbit_audit_events' FROM DUAL
  WHERE (@orbit_retention_purge = 1 AND OLD.created_at < UTC_TIMESTAMP(6) - INTERVAL (
    SELECT GREATEST(r.audit_days, 7) FROM orbit_retention r WHERE r.namespace_id = OLD.namespace_id
  ) DAY) IS NOT TRUE;

DROP TRIGGER trg_orbit_audit_events_no_delete;

CREATE TRIGGER trg_pulse_attempt_evidence_purge_only BEFORE DELETE ON pulse_attempt_evidence FOR EACH ROW
  INSERT INTO orbit_history_guard (refused_table) SELECT 'pulse_attempt_evidence' FROM DUAL
  WHERE (@orbit_retention_purge = 1 AND OLD.created_at < UTC_TIMESTAMP(6) - INTERVAL (
    SELECT GREATEST(r.finished_tasks_days, 1) FROM orbit_retention r WHERE r.namespace_id = OLD.namespace_id
  ) DAY) IS NOT TRUE;

DROP TRIGGER trg_pulse_attempt_evidence_no_delete
