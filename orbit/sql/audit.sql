-- Audit events (orbit_audit_events): insert and read only, the table is immutable.

-- name: audit_insert
INSERT INTO orbit_audit_events
  (namespace_id, id, credential_id, application_id, action, resource_kind, resource_id,
   outcome, status_code, request_id, details, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(credential_id)s, %(application_id)s, %(action)s,
   %(resource_kind)s, %(resource_id)s, %(outcome)s, %(status_code)s, %(request_id)s,
   %(details)s, COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: audit_list_recent
SELECT namespace_id, id, credential_id, application_id, action, resource_kind, resource_id,
  outcome, status_code, request_id, details, created_at
FROM orbit_audit_events
WHERE namespace_id = %(namespace_id)s
ORDER BY created_at DESC, id
LIMIT %(limit)s

-- name: audit_list_by_request
SELECT namespace_id, id, credential_id, application_id, action, resource_kind, resource_id,
  outcome, status_code, request_id, details, created_at
FROM orbit_audit_events
WHERE namespace_id = %(namespace_id)s AND request_id = %(request_id)s
ORDER BY created_at, id

-- The audit list (GET /v1/namespaces/{ns}/audit): newest first, in [since, until), before a
-- cursor position (created_at, id). One query per filter combination, each on the index that
-- serves it: ix_orbit_audit_events_created (no filter), ..._action (action, and action with
-- outcome), ..._outcome (outcome). The credential's name comes with each event (LEFT JOIN:
-- the CLI acts without one).

-- name: audit_page
SELECT e.namespace_id, e.id, e.credential_id, e.application_id, e.action, e.resource_kind,
  e.resource_id, e.outcome, e.status_code, e.request_id, e.details, e.created_at,
  c.name AS credential_name
FROM orbit_audit_events e
LEFT JOIN orbit_credentials c ON c.id = e.credential_id
WHERE e.namespace_id = %(namespace_id)s
  AND e.created_at >= %(since)s AND e.created_at < %(until)s
  AND e.created_at <= %(before_t)s AND (e.created_at < %(before_t)s OR e.id < %(before_id)s)
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: audit_page_by_action
SELECT e.namespace_id, e.id, e.credential_id, e.application_id, e.action, e.resource_kind,
  e.resource_id, e.outcome, e.status_code, e.request_id, e.details, e.created_at,
  c.name AS credential_name
FROM orbit_audit_events e FORCE INDEX (ix_orbit_audit_events_action)
LEFT JOIN orbit_credentials c ON c.id = e.credential_id
WHERE e.namespace_id = %(namespace_id)s AND e.action = %(action)s
  AND (%(outcome)s IS NULL OR e.outcome = %(outcome)s)
  AND e.created_at >= %(since)s AND e.created_at < %(until)s
  AND e.created_at <= %(before_t)s AND (e.created_at < %(before_t)s OR e.id < %(before_id)s)
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: audit_page_by_outcome
SELECT e.namespace_id, e.id, e.credential_id, e.application_id, e.action, e.resource_kind,
  e.resource_id, e.outcome, e.status_code, e.request_id, e.details, e.created_at,
  c.name AS credential_name
FROM orbit_audit_events e FORCE INDEX (ix_orbit_audit_events_outcome)
LEFT JOIN orbit_credentials c ON c.id = e.credential_id
WHERE e.namespace_id = %(namespace_id)s AND e.outcome = %(outcome)s
  AND e.created_at >= %(since)s AND e.created_at < %(until)s
  AND e.created_at <= %(before_t)s AND (e.created_at < %(before_t)s OR e.id < %(before_id)s)
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: audit_purge
-- Retention purge (orbit/retention_purge.py, with @orbit_retention_purge set): the oldest
-- audit events before the cutoff, on ix_orbit_audit_events_created, bounded.
DELETE FROM orbit_audit_events
WHERE namespace_id = %(namespace_id)s AND created_at < %(cutoff)s
ORDER BY created_at
LIMIT %(limit)s

-- name: audit_oldest
SELECT MIN(created_at) FROM orbit_audit_events WHERE namespace_id = %(namespace_id)s
