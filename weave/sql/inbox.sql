-- The inbox of internal events that advance instances (weave_inbox). Every query filters
-- namespace_id first, except the documented cross-namespace scan inbox_scan_pending
-- (tests/sql_guard.py ALLOW).

-- name: inbox_columns
namespace_id, id, instance_id, kind, source_event_id, step_path, payload, data, available_at,
  attempts, last_error, processed_at, outcome, created_at, revision

-- name: inbox_insert
-- %(now)s NULL stamps the database clock (the Pulse hook writes without a pinned clock).
-- De-duplicated by uq_weave_inbox_source (namespace_id, source_event_id): a second insert for
-- the same source event fails with 1062, which the writer treats as "already there".
INSERT INTO weave_inbox
  (namespace_id, id, instance_id, kind, source_event_id, step_path, payload, data,
   available_at, attempts, last_error, processed_at, outcome, created_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(kind)s, %(source_event_id)s, %(step_path)s,
   %(payload)s, %(data)s, COALESCE(%(now)s, UTC_TIMESTAMP(6)), 0, NULL, NULL, NULL,
   COALESCE(%(now)s, UTC_TIMESTAMP(6)), 1)

-- name: inbox_scan_pending
-- Cross-namespace scan (allow-listed): due events, oldest first, a range read of
-- ix_weave_inbox_pending that stops at the limit (no grouping over the whole backlog; the
-- caller de-duplicates instances). No locks: the advancer then locks each instance by its
-- (namespace_id, id) key with SKIP LOCKED and re-reads its events under that lock.
SELECT namespace_id, instance_id
FROM weave_inbox
WHERE processed_at IS NULL AND available_at <= %(now)s
ORDER BY available_at
LIMIT %(limit)s

-- name: inbox_lock_pending_for_instance
-- The instance's unprocessed events in arrival order (ix_weave_inbox_instance), due or not:
-- the advancer applies them in order and stops at the first one not yet due (backed off), so
-- a retried event is never overtaken. The caller holds the instance lock; SKIP LOCKED passes
-- over rows still being inserted.
SELECT {cols} FROM weave_inbox
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND processed_at IS NULL
ORDER BY created_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: inbox_get
SELECT {cols} FROM weave_inbox
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: inbox_mark_processed_if_pending
-- Guarded: an event is consumed exactly once. False = already processed.
UPDATE weave_inbox
SET processed_at = %(now)s, outcome = %(outcome)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND processed_at IS NULL

-- name: inbox_record_failure_if_pending
-- A failed advance: count it, keep the error, and retry after a backoff.
UPDATE weave_inbox
SET attempts = attempts + 1, last_error = %(last_error)s, available_at = %(available_at)s,
    revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND processed_at IS NULL

-- name: inbox_count_pending_for_instance
SELECT COUNT(*) AS n FROM weave_inbox
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND processed_at IS NULL
