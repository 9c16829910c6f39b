-- Credentials (orbit_credentials): API keys, stored as the SHA-256 digest of the secret.

-- name: credential_insert
INSERT INTO orbit_credentials
  (id, application_id, name, secret_digest, namespaces, actions, queues, global_admin,
   expires_at, revoked_at, revision, created_at)
VALUES
  (%(id)s, %(application_id)s, %(name)s, %(secret_digest)s, %(namespaces)s, %(actions)s,
   %(queues)s, %(global_admin)s, %(expires_at)s, NULL, 1, COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: credential_get_for_auth
-- One indexed read per request, never cached: revocation, expiry and a disabled application
-- take effect on the next request on every node. The namespace join resolves {ns}.
SELECT c.id, c.application_id, c.secret_digest, c.namespaces, c.actions, c.queues,
  c.global_admin, c.revision,
  (c.revoked_at IS NOT NULL) AS revoked,
  (c.expires_at IS NOT NULL AND c.expires_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))) AS expired,
  a.status AS application_status,
  n.id AS namespace_id
FROM orbit_credentials c
JOIN orbit_applications a ON a.id = c.application_id
LEFT JOIN orbit_namespaces n ON n.application_id = c.application_id AND n.name = %(namespace)s
WHERE c.id = %(id)s

-- name: credential_get
SELECT id, application_id, name, namespaces, actions, queues, global_admin, expires_at,
  revoked_at, revision, created_at
FROM orbit_credentials
WHERE id = %(id)s

-- name: credential_list_for_application
SELECT id, application_id, name, namespaces, actions, queues, global_admin, expires_at,
  revoked_at, revision, created_at
FROM orbit_credentials
WHERE application_id = %(application_id)s AND id > %(after_id)s
ORDER BY id
LIMIT %(limit)s

-- name: credential_find_by_name
SELECT id, application_id, name, namespaces, actions, queues, global_admin, expires_at,
  revoked_at, revision, created_at
FROM orbit_credentials
WHERE application_id = %(application_id)s AND name = %(name)s AND revoked_at IS NULL
ORDER BY created_at, id
LIMIT 1

-- name: credential_revoke_if_revision
UPDATE orbit_credentials
SET revoked_at = COALESCE(%(now)s, UTC_TIMESTAMP(6)), revision = revision + 1
WHERE id = %(id)s AND revision = %(revision)s AND revoked_at IS NULL

-- name: credential_rotate_if_revision
-- Bootstrap re-run: new secret (the previous key stops working) and the full grant again.
UPDATE orbit_credentials
SET secret_digest = %(secret_digest)s, namespaces = %(namespaces)s, actions = %(actions)s,
  queues = NULL, global_admin = %(global_admin)s, expires_at = NULL,
  revision = revision + 1
WHERE id = %(id)s AND revision = %(revision)s AND revoked_at IS NULL
