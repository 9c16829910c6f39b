-- Raw events, result events and the per-namespace result sequence (orbit_events,
-- orbit_result_events, orbit_event_streams). Every query filters namespace_id first.

-- name: event_insert
INSERT INTO orbit_events
  (namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(type)s, %(subject_kind)s, %(subject_id)s, %(data)s,
   %(request_id)s, COALESCE(%(created_at)s, UTC_TIMESTAMP(6)))

-- name: event_insert_many
-- Plain placeholders only, so the driver sends one multi-row INSERT: created_at is required.
INSERT INTO orbit_events
  (namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(type)s, %(subject_kind)s, %(subject_id)s, %(data)s,
   %(request_id)s, %(created_at)s)

-- name: clock_now
SELECT UTC_TIMESTAMP(6) AS now

-- name: event_list_for_subject
SELECT namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at
FROM orbit_events
WHERE namespace_id = %(namespace_id)s AND subject_kind = %(subject_kind)s
  AND subject_id = %(subject_id)s
ORDER BY created_at, id
LIMIT %(limit)s

-- name: result_event_insert_many
INSERT INTO orbit_result_events
  (namespace_id, seq, event_id, type, task_id, queue, kind, owner_id, state, result, error,
   attempts, finished_at, created_at)
VALUES
  (%(namespace_id)s, %(seq)s, %(event_id)s, %(type)s, %(task_id)s, %(queue)s, %(kind)s,
   %(owner_id)s, %(state)s, %(result)s, %(error)s, %(attempts)s, %(finished_at)s,
   %(created_at)s)

-- name: result_event_list_after
SELECT namespace_id, seq, event_id, type, task_id, queue, kind, owner_id, state, result,
  error, attempts, finished_at, created_at
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: result_event_last_seq
SELECT COALESCE(MAX(seq), 0) AS last_seq
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s
