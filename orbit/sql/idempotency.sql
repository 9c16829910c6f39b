-- Idempotency keys (orbit_idempotency_keys). Unique per (namespace, operation, scope, key).

-- name: idempotency_get
SELECT namespace_id, id, request_digest, response_status, response_body, created_at,
  expires_at, (expires_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))) AS expired
FROM orbit_idempotency_keys
WHERE namespace_id = %(namespace_id)s AND operation = %(operation)s AND scope = %(scope)s
  AND idem_key = %(idem_key)s

-- name: idempotency_insert
-- A concurrent insert of the same key blocks here on the unique index until the first
-- transaction ends: then 1062 (it committed: re-read and replay) or success (it rolled back).
-- The window is the namespace's idempotency_hours when its retention settings name one
-- (orbit_retention, one primary-key read in the same statement), else retention_us.
INSERT INTO orbit_idempotency_keys
  (namespace_id, id, operation, scope, idem_key, request_digest, response_status,
   response_body, created_at, expires_at)
VALUES
  (%(namespace_id)s, %(id)s, %(operation)s, %(scope)s, %(idem_key)s, %(request_digest)s,
   NULL, NULL, COALESCE(%(now)s, UTC_TIMESTAMP(6)),
   COALESCE(%(now)s, UTC_TIMESTAMP(6)) + INTERVAL COALESCE(
     (SELECT r.idempotency_hours * 3600000000 FROM orbit_retention r
      WHERE r.namespace_id = %(namespace_id)s),
     %(retention_us)s) MICROSECOND)

-- name: idempotency_delete_if_expired
DELETE FROM orbit_idempotency_keys
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
  AND expires_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))

-- name: idempotency_store_response_if_pending
UPDATE orbit_idempotency_keys
SET response_status = %(status)s, response_body = %(body)s
WHERE namespace_id = %(namespace_id)s AND operation = %(operation)s AND scope = %(scope)s
  AND idem_key = %(idem_key)s AND response_status IS NULL

-- name: idempotency_delete_expired_batch
-- cross-namespace: retention cleanup scans by expires_at over every namespace (allow-listed
-- in tests/sql_guard.py). Bounded by LIMIT, oldest first.
DELETE FROM orbit_idempotency_keys
WHERE expires_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))
ORDER BY expires_at
LIMIT %(limit)s
