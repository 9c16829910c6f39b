-- Namespaces (orbit_namespaces). Control-plane table: a namespace row is the namespace.

-- name: namespace_insert
INSERT INTO orbit_namespaces (id, application_id, name, revision, created_at)
VALUES (%(id)s, %(application_id)s, %(name)s, 1, COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: namespace_get
SELECT id, application_id, name, revision, created_at
FROM orbit_namespaces
WHERE id = %(id)s

-- name: namespace_get_by_name
SELECT id, application_id, name, revision, created_at
FROM orbit_namespaces
WHERE application_id = %(application_id)s AND name = %(name)s

-- name: namespace_list_for_application
SELECT id, application_id, name, revision, created_at
FROM orbit_namespaces
WHERE application_id = %(application_id)s AND name > %(after_name)s
ORDER BY name
LIMIT %(limit)s
