-- Signals (weave_signals). Every query filters namespace_id first.

-- name: signal_columns
namespace_id, id, instance_id, signal_id, name, correlation_key, payload, request_digest,
  matched_wait_id, matched_at, sent_by, received_at, revision

-- name: signal_insert
-- A duplicate signal_id (uq_weave_signals_signal_id) waits for a concurrent sender's commit,
-- then fails with 1062: the sender re-reads and answers the stored signal.
INSERT INTO weave_signals
  (namespace_id, id, instance_id, signal_id, name, correlation_key, payload, request_digest,
   matched_wait_id, matched_at, sent_by, received_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(signal_id)s, %(name)s, %(correlation_key)s,
   %(payload)s, %(request_digest)s, NULL, NULL, %(sent_by)s, %(now)s, 1)

-- name: signal_get
SELECT {cols} FROM weave_signals
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: signal_get_by_signal_id
SELECT {cols} FROM weave_signals
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND signal_id = %(signal_id)s

-- name: signal_find_unmatched
-- The oldest kept signal a newly opened wait takes (ix_weave_signals_unmatched). A wait with
-- a correlation key takes only that key; a wait without one takes any.
SELECT {cols} FROM weave_signals
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND name = %(name)s AND matched_at IS NULL
  AND (%(correlation_key)s IS NULL OR correlation_key = %(correlation_key)s)
ORDER BY received_at, id
LIMIT 1

-- name: signal_match_if_unmatched
UPDATE weave_signals
SET matched_wait_id = %(wait_id)s, matched_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND matched_wait_id IS NULL

-- name: signal_list_for_instance
SELECT {cols} FROM weave_signals
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
ORDER BY received_at, id
LIMIT %(limit)s
