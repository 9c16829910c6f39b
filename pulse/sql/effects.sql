-- Side-effect ledger (pulse_effects): one row per (namespace, task, key digest), stable
-- across the task's attempts. Lock order: task → attempt → effect row.

-- name: effect_lock
SELECT namespace_id, id, task_id, effect_key, key_digest, state, attempt_id, generation,
  result, begun_at, committed_at, revision
FROM pulse_effects
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s AND key_digest = %(key_digest)s
FOR UPDATE

-- name: effect_insert
-- Raises 1062 on uq_pulse_effects_key when the key exists already.
INSERT INTO pulse_effects
  (namespace_id, id, task_id, effect_key, key_digest, state, attempt_id, generation, result,
   begun_at, committed_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(task_id)s, %(effect_key)s, %(key_digest)s, %(state)s,
   %(attempt_id)s, %(generation)s, %(result)s, %(now)s, %(committed_at)s, 1)

-- name: effect_commit_if_begun
-- BEGUN → COMMITTED with the result, by the committing attempt. 0 rows = already committed
-- or the revision moved on.
UPDATE pulse_effects
SET state = 'COMMITTED', result = %(result)s, committed_at = %(now)s,
  attempt_id = %(attempt_id)s, generation = %(generation)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'BEGUN'
  AND revision = %(revision)s

-- name: effect_list_for_task
SELECT namespace_id, id, task_id, effect_key, key_digest, state, attempt_id, generation,
  result, begun_at, committed_at, revision
FROM pulse_effects
WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
ORDER BY begun_at, id

-- name: effect_purge_for_tasks
-- Retention purge: the side-effect ledger of purged tasks.
DELETE FROM pulse_effects WHERE namespace_id = %(namespace_id)s AND task_id IN %(ids)s
