-- Raw events, result events and the per-namespace result sequence (orbit_events,
-- orbit_result_events, orbit_event_streams). Every query filters namespace_id first.

-- name: event_batch_insert_many
-- Plain placeholders only, so the driver sends one multi-row INSERT: created_at is required.
INSERT INTO orbit_event_batches
  (namespace_id, id, type, subject_kind, subjects, entries, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(type)s, %(subject_kind)s, %(subjects)s, %(entries)s,
   %(created_at)s)

-- name: event_list_for_subject
-- Rows written before raw events were batches (orbit_event_batches), on ix_orbit_events_subject.
SELECT namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at
FROM orbit_events
WHERE namespace_id = %(namespace_id)s AND subject_kind = %(subject_kind)s
  AND subject_id = %(subject_id)s
ORDER BY created_at, id
LIMIT %(limit)s

-- name: event_list_window
-- Rows written before raw events were batches, of a namespace in a time window
-- (ix_orbit_events_created); NULL bounds are open.
SELECT namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at
FROM orbit_events
WHERE namespace_id = %(namespace_id)s
  AND (%(since)s IS NULL OR created_at >= %(since)s)
  AND (%(until)s IS NULL OR created_at < %(until)s)
  AND (%(type)s IS NULL OR type = %(type)s)
ORDER BY created_at, id
LIMIT %(limit)s

-- name: event_batch_list
-- The batch rows of a namespace in a time window (ix_orbit_event_batches_created); NULL
-- bounds are open.
SELECT namespace_id, id, type, subject_kind, subjects, entries, created_at
FROM orbit_event_batches
WHERE namespace_id = %(namespace_id)s
  AND (%(since)s IS NULL OR created_at >= %(since)s)
  AND (%(until)s IS NULL OR created_at < %(until)s)
  AND (%(type)s IS NULL OR type = %(type)s)
ORDER BY created_at, id
LIMIT %(limit)s

-- name: event_batch_list_for_subject
-- The batch rows of a namespace in a time window that name one subject: the window's range
-- of ix_orbit_event_batches_created, each row's entries searched for the subject's id.
SELECT namespace_id, id, type, subject_kind, subjects, entries, created_at
FROM orbit_event_batches
WHERE namespace_id = %(namespace_id)s AND subject_kind = %(subject_kind)s
  AND (%(since)s IS NULL OR created_at >= %(since)s)
  AND (%(until)s IS NULL OR created_at < %(until)s)
  AND JSON_SEARCH(entries, 'one', %(subject_hex)s, NULL, '$[*].subject_id') IS NOT NULL
ORDER BY created_at, id
LIMIT %(limit)s

-- name: result_event_insert_many
INSERT INTO orbit_result_events
  (namespace_id, seq, event_id, type, task_id, queue, kind, owner_id, state, result, error,
   attempts, finished_at, created_at)
VALUES
  (%(namespace_id)s, %(seq)s, %(event_id)s, %(type)s, %(task_id)s, %(queue)s, %(kind)s,
   %(owner_id)s, %(state)s, %(result)s, %(error)s, %(attempts)s, %(finished_at)s,
   COALESCE(%(created_at)s, UTC_TIMESTAMP(6)))

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

-- The paged history of one subject (orbit.events.subject_history), bounded in work: first
-- where a scan of at most N batch rows of the window ends (index only, on
-- ix_orbit_event_batches_created), then the rows before that point that name the subject.

-- name: event_batch_scan_end
SELECT created_at
FROM orbit_event_batches
WHERE namespace_id = %(namespace_id)s
  AND created_at >= %(since)s AND created_at < %(until)s
ORDER BY created_at
LIMIT 1 OFFSET %(offset)s

-- name: event_batch_list_naming
-- The needle is the entry's opening ("subject_id":"<32 hex>"): a plain substring search,
-- each entry is then checked exactly when it is decoded.
SELECT namespace_id, id, type, subject_kind, subjects, entries, created_at
FROM orbit_event_batches
WHERE namespace_id = %(namespace_id)s
  AND created_at >= %(since)s AND created_at < %(until)s
  AND subject_kind = %(subject_kind)s AND LOCATE(%(needle)s, entries) > 0
ORDER BY created_at, id

-- name: event_list_for_subject_window
-- Rows written before raw events were batches, of one subject in a time window
-- (ix_orbit_events_subject).
SELECT namespace_id, id, type, subject_kind, subject_id, data, request_id, created_at
FROM orbit_events
WHERE namespace_id = %(namespace_id)s AND subject_kind = %(subject_kind)s
  AND subject_id = %(subject_id)s
  AND created_at >= %(since)s AND created_at < %(until)s
ORDER BY created_at, id
LIMIT %(limit)s

-- name: result_event_sizes_after
-- The page result_event_list_after would read, sized: each event's seq, queue and the bytes
-- of its stored result and error (a list page is cut at its byte budget before it is read).
SELECT seq, queue, COALESCE(LENGTH(result), 0) + COALESCE(LENGTH(error), 0) AS page_bytes
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: result_event_get_many
SELECT namespace_id, seq, event_id, type, task_id, queue, kind, owner_id, state, result,
  error, attempts, finished_at, created_at
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq IN %(seqs)s
ORDER BY seq

-- name: event_batch_purge
-- Retention purge (orbit/retention_purge.py, with @orbit_retention_purge set): the oldest
-- batch rows before the cutoff, on ix_orbit_event_batches_created, bounded.
DELETE FROM orbit_event_batches
WHERE namespace_id = %(namespace_id)s AND created_at < %(cutoff)s
ORDER BY created_at
LIMIT %(limit)s

-- name: event_batch_oldest
SELECT MIN(created_at) FROM orbit_event_batches WHERE namespace_id = %(namespace_id)s

-- name: event_legacy_purge
-- Retention purge of the rows written before event batches existed (ix_orbit_events_created).
DELETE FROM orbit_events
WHERE namespace_id = %(namespace_id)s AND created_at < %(cutoff)s
ORDER BY created_at
LIMIT %(limit)s

-- name: result_event_purge_scan
-- The next result events the purge may remove: after the purged mark, up to the bound no
-- subscription still needs, in sequence order (primary key range).
SELECT seq, created_at
FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq > %(after_seq)s AND seq <= %(upto_seq)s
ORDER BY seq
LIMIT %(limit)s

-- name: result_event_purge_range
DELETE FROM orbit_result_events
WHERE namespace_id = %(namespace_id)s AND seq > %(after_seq)s AND seq <= %(upto_seq)s
