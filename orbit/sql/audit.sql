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
