-- Poll steps: progress (weave_poll_states) and the immutable record of each evaluated round
-- (weave_poll_rounds). Every query filters namespace_id first.

-- name: poll_state_columns
namespace_id, id, instance_id, step_path, state, rounds_started, rounds_completed, max_rounds,
  max_attempts, interval_ms, deadline_at, next_round_at, current_activation_id, last_result,
  exhausted_reason, started_at, finished_at, revision

-- name: poll_state_insert
INSERT INTO weave_poll_states
  (namespace_id, id, instance_id, step_path, state, rounds_started, rounds_completed,
   max_rounds, max_attempts, interval_ms, deadline_at, next_round_at, current_activation_id,
   last_result, exhausted_reason, started_at, finished_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(step_path)s, 'ACTIVE', 0, 0, %(max_rounds)s,
   %(max_attempts)s, %(interval_ms)s, %(deadline_at)s, NULL, NULL, NULL, NULL, %(now)s, NULL, 1)

-- name: poll_state_get
SELECT {cols} FROM weave_poll_states
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND step_path = %(step_path)s

-- name: poll_state_update_if_revision
UPDATE weave_poll_states
SET state = %(state)s, rounds_started = %(rounds_started)s,
    rounds_completed = %(rounds_completed)s, next_round_at = %(next_round_at)s,
    current_activation_id = %(current_activation_id)s, last_result = %(last_result)s,
    exhausted_reason = %(exhausted_reason)s, finished_at = %(finished_at)s,
    revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: poll_round_insert
-- Written once, when the round's outcome is known (the table is immutable).
INSERT INTO weave_poll_rounds
  (namespace_id, id, poll_state_id, instance_id, step_path, round_no, activation_id, task_id,
   outcome, result, error, evaluated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(poll_state_id)s, %(instance_id)s, %(step_path)s, %(round_no)s,
   %(activation_id)s, %(task_id)s, %(outcome)s, %(result)s, %(error)s, %(now)s)

-- name: poll_round_list
SELECT namespace_id, id, poll_state_id, instance_id, step_path, round_no, activation_id,
  task_id, outcome, result, error, evaluated_at
FROM weave_poll_rounds
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND step_path = %(step_path)s
ORDER BY round_no
LIMIT %(limit)s
