-- Applications (orbit_applications): the tenants. Control-plane table, keyed by id.

-- name: application_insert
INSERT INTO orbit_applications (id, name, status, revision, created_at, updated_at)
VALUES (%(id)s, %(name)s, 'active', 1, COALESCE(%(now)s, UTC_TIMESTAMP(6)),
  COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: application_get
SELECT id, name, status, revision, created_at, updated_at
FROM orbit_applications
WHERE id = %(id)s

-- name: application_get_by_name_for_update
SELECT id, name, status, revision, created_at, updated_at
FROM orbit_applications
WHERE name = %(name)s
FOR UPDATE

-- name: application_list_after
SELECT id, name, status, revision, created_at, updated_at
FROM orbit_applications
WHERE id > %(after_id)s
ORDER BY id
LIMIT %(limit)s

-- name: application_set_status_if_revision
UPDATE orbit_applications
SET status = %(status)s, revision = revision + 1,
  updated_at = COALESCE(%(now)s, UTC_TIMESTAMP(6))
WHERE id = %(id)s AND revision = %(revision)s
