-- Retention settings and purge progress (orbit_retention), and the session flag that lets
-- the history tables' delete triggers accept the purge's deletes (migrations/0015).

-- name: retention_get
SELECT namespace_id, finished_tasks_days, events_days, audit_days, idempotency_hours,
  revision, purged_total, result_seq_purged, last_run_at, next_run_at, created_at, updated_at
FROM orbit_retention
WHERE namespace_id = %(namespace_id)s

-- name: retention_get_for_update
SELECT namespace_id, finished_tasks_days, events_days, audit_days, idempotency_hours,
  revision, purged_total, result_seq_purged, last_run_at, next_run_at, created_at, updated_at
FROM orbit_retention
WHERE namespace_id = %(namespace_id)s
FOR UPDATE

-- name: retention_insert
-- A concurrent first PUT of the same namespace gets 1062 on the primary key (retried as an
-- update by the service).
INSERT INTO orbit_retention
  (namespace_id, finished_tasks_days, events_days, audit_days, idempotency_hours, revision,
   purged_total, result_seq_purged, last_run_at, next_run_at, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(finished_tasks_days)s, %(events_days)s, %(audit_days)s,
   %(idempotency_hours)s, %(revision)s, 0, 0, NULL, COALESCE(%(now)s, UTC_TIMESTAMP(6)),
   COALESCE(%(now)s, UTC_TIMESTAMP(6)), COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: retention_update_if_revision
-- The settings change; the purge is due at once (a shorter window applies without waiting
-- out the interval).
UPDATE orbit_retention
SET finished_tasks_days = %(finished_tasks_days)s, events_days = %(events_days)s,
  audit_days = %(audit_days)s, idempotency_hours = %(idempotency_hours)s,
  revision = revision + 1, next_run_at = COALESCE(%(now)s, UTC_TIMESTAMP(6)),
  updated_at = COALESCE(%(now)s, UTC_TIMESTAMP(6))
WHERE namespace_id = %(namespace_id)s AND revision = %(revision)s

-- name: retention_claim_due
-- cross-namespace: the purge claims the most overdue namespace of any (allow-listed in
-- tests/sql_guard.py); index ix_orbit_retention_due, SKIP LOCKED so nodes share the work.
SELECT namespace_id
FROM orbit_retention
WHERE next_run_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))
ORDER BY next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: retention_set_next_run
UPDATE orbit_retention
SET next_run_at = COALESCE(%(now)s, UTC_TIMESTAMP(6)) + INTERVAL %(after_ms)s * 1000 MICROSECOND
WHERE namespace_id = %(namespace_id)s

-- name: retention_add_progress
-- Purge progress; never bumps revision (settings ETags stay valid).
UPDATE orbit_retention
SET purged_total = purged_total + %(purged)s,
  result_seq_purged = GREATEST(result_seq_purged, %(result_seq_purged)s)
WHERE namespace_id = %(namespace_id)s

-- name: retention_finish_pass
UPDATE orbit_retention
SET last_run_at = COALESCE(%(now)s, UTC_TIMESTAMP(6)),
  next_run_at = COALESCE(%(now)s, UTC_TIMESTAMP(6)) + INTERVAL %(after_ms)s * 1000 MICROSECOND
WHERE namespace_id = %(namespace_id)s

-- name: retention_purge_begin
-- Only the purge sets this (orbit/retention_purge.py), and clears it before its
-- transaction ends: the delete triggers refuse every delete without it.
SET @orbit_retention_purge = 1

-- name: retention_purge_end
SET @orbit_retention_purge = NULL
