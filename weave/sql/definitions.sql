-- Workflow definitions and their immutable versions (weave_definitions, weave_definition_versions).
-- Every query filters namespace_id first. Times come in as %(now)s: NULL means the database clock.

-- name: definition_get_by_name
SELECT namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at
FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: definition_lock_by_name
-- Serialises publishes of one workflow: the version number is latest_version + 1 under this lock.
SELECT namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at
FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
FOR UPDATE

-- name: definition_get_by_name_shared
-- An instance start reads its workflow under a shared lock: a delete (FOR UPDATE) waits for
-- the start to commit (and then sees its RUNNING instance), or runs first (and the start then
-- sees no workflow).
SELECT namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at
FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
LOCK IN SHARE MODE

-- name: definition_delete_if_revision
-- Delete a workflow definition row (its immutable versions stay as history). 0 rows = the
-- revision moved on.
DELETE FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: definition_running_instances
-- RUNNING instances of a definition (index ix_weave_instances_definition), at most
-- %(limit)s ids, and how many there are in total (a delete is refused while any runs).
SELECT id, COUNT(*) OVER () AS total
FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND definition_id = %(definition_id)s
  AND state = 'RUNNING'
ORDER BY created_at, id
LIMIT %(limit)s

-- name: definition_get
SELECT namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at
FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: definition_insert
INSERT INTO weave_definitions
  (namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(name)s, %(owner_id)s, 1, 1,
   COALESCE(%(now)s, UTC_TIMESTAMP(6)), COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: definition_set_latest_if_revision
-- CAS: only from the revision the caller read (under its row lock); always bumps revision.
UPDATE weave_definitions
SET latest_version = %(version)s, revision = revision + 1,
    updated_at = COALESCE(%(now)s, UTC_TIMESTAMP(6))
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND latest_version = %(version)s - 1

-- name: definition_list
SELECT namespace_id, id, name, owner_id, latest_version, revision, created_at, updated_at
FROM weave_definitions
WHERE namespace_id = %(namespace_id)s AND name > %(after_name)s
ORDER BY name
LIMIT %(limit)s

-- name: version_insert
INSERT INTO weave_definition_versions
  (namespace_id, id, definition_id, version, definition, definition_digest, language_version,
   step_count, published_by, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(definition_id)s, %(version)s, %(definition)s, %(digest)s,
   %(language_version)s, %(step_count)s, %(published_by)s, COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: version_get
SELECT namespace_id, id, definition_id, version, definition, definition_digest, language_version,
       step_count, published_by, created_at
FROM weave_definition_versions
WHERE namespace_id = %(namespace_id)s AND definition_id = %(definition_id)s AND version = %(version)s

-- name: version_list
-- Newest first, below a version (exclusive) for paging. The definition text is not read.
SELECT namespace_id, id, definition_id, version, '' AS definition, definition_digest,
       language_version, step_count, published_by, created_at
FROM weave_definition_versions
WHERE namespace_id = %(namespace_id)s AND definition_id = %(definition_id)s
  AND version < %(before_version)s
ORDER BY version DESC
LIMIT %(limit)s
