-- Activations (weave_activations): each task run, poll round, timer and signal wait.
-- Every query filters namespace_id first.

-- name: activation_columns
namespace_id, id, instance_id, step_path, activation_no, kind, task_id, state, result, error,
  condition_met, seq, started_at, finished_at, revision

-- name: activation_insert
INSERT INTO weave_activations
  (namespace_id, id, instance_id, step_path, activation_no, kind, task_id, state, result, error,
   condition_met, seq, started_at, finished_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(step_path)s, %(activation_no)s, %(kind)s,
   %(task_id)s, %(state)s, %(result)s, %(error)s, %(condition_met)s, %(seq)s, %(started_at)s,
   %(finished_at)s, 1)

-- name: activation_get
SELECT {cols} FROM weave_activations
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: activation_get_by_number
SELECT {cols} FROM weave_activations
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND step_path = %(step_path)s AND activation_no = %(activation_no)s

-- name: activation_finish_if_running
-- Guarded: only a RUNNING activation ends, once. False = it had ended already.
UPDATE weave_activations
SET state = %(state)s, result = %(result)s, error = %(error)s,
    condition_met = %(condition_met)s, finished_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'RUNNING'

-- name: activation_list_page
-- History: activations of an instance in history order, after a position.
SELECT {cols} FROM weave_activations
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: activation_tasks_of_running
-- Retention purge: which of these tasks belong to a workflow instance still RUNNING (the
-- instance may still read them); uq_weave_activations_task, then the instance by key.
SELECT a.task_id
FROM weave_activations a
JOIN weave_instances i ON i.namespace_id = a.namespace_id AND i.id = a.instance_id
WHERE a.namespace_id = %(namespace_id)s AND a.task_id IN %(ids)s AND i.state = 'RUNNING'
