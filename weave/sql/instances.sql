-- Workflow instances (weave_instances). Every query filters namespace_id first.
-- Times come in as %(now)s already resolved (the engine reads the database clock once per
-- transaction, or tests pin it), so one advance stamps every row it writes with one time.
-- {cols} stands for the instance_columns block (expanded by the store when loaded).

-- name: instance_columns
namespace_id, id, owner_id, definition_id, definition_name, version, business_key, input,
  output, error, state, paused, control_revision, history_seq, created_by, revision,
  created_at, updated_at, finished_at

-- name: instance_insert
INSERT INTO weave_instances
  (namespace_id, id, owner_id, definition_id, definition_name, version, business_key, input,
   state, paused, control_revision, history_seq, created_by, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(owner_id)s, %(definition_id)s, %(definition_name)s,
   %(version)s, %(business_key)s, %(input)s, 'RUNNING', 0, 1, 0, %(created_by)s, 1,
   %(now)s, %(now)s)

-- name: instance_get
SELECT {cols} FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: instance_lock
-- Serialises every change of one instance (advance, pause, resume, cancel).
SELECT {cols} FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: instance_lock_skip_locked
-- The advancer's lock: an instance another advancer (or a control request) holds is skipped
-- and picked up on a later round, so advancers never queue behind each other.
SELECT {cols} FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE SKIP LOCKED

-- name: instance_get_by_business_key
SELECT {cols} FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND definition_id = %(definition_id)s
  AND business_key = %(business_key)s

-- name: instance_update_if_revision
-- CAS from the revision the caller read under its row lock; always bumps revision.
UPDATE weave_instances
SET state = %(state)s, output = %(output)s, error = %(error)s, paused = %(paused)s,
    control_revision = %(control_revision)s, history_seq = %(history_seq)s,
    finished_at = %(finished_at)s, updated_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: instance_list
-- Newest first, keyset-paged on (created_at, id); optional filters.
SELECT {cols} FROM weave_instances
WHERE namespace_id = %(namespace_id)s
  AND (%(state)s IS NULL OR state = %(state)s)
  AND (%(definition_id)s IS NULL OR definition_id = %(definition_id)s)
  AND (created_at < %(before_at)s OR (created_at = %(before_at)s AND id < %(before_id)s))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: instance_oldest_running
-- Retention: the start of the namespace's oldest running instance (its events are kept).
SELECT MIN(created_at) FROM weave_instances
WHERE namespace_id = %(namespace_id)s AND state = 'RUNNING'
