-- Per instance, per step state (weave_steps). Every query filters namespace_id first.
-- Rows of one instance are written only under the instance row lock.

-- name: step_columns
namespace_id, id, instance_id, step_path, step_type, state, next_step, activations, output,
  error, seq, started_at, finished_at, revision

-- name: step_insert
INSERT INTO weave_steps
  (namespace_id, id, instance_id, step_path, step_type, state, next_step, activations, output,
   error, seq, started_at, finished_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(step_path)s, %(step_type)s, %(state)s,
   %(next_step)s, %(activations)s, %(output)s, %(error)s, %(seq)s, %(started_at)s,
   %(finished_at)s, 1)

-- name: step_update_if_revision
-- CAS (the caller holds the instance lock, so a miss is a bug); always bumps revision.
UPDATE weave_steps
SET state = %(state)s, next_step = %(next_step)s, activations = %(activations)s,
    output = %(output)s, error = %(error)s, finished_at = %(finished_at)s,
    revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: step_list_for_instance
-- Every step of an instance (at most the definition's step count, <= 1000).
SELECT {cols} FROM weave_steps
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
ORDER BY seq
