-- Signal waits and durable timers (weave_waits). Every query filters namespace_id first,
-- except the documented cross-namespace due-timer claim wait_claim_due (tests/sql_guard.py).

-- name: wait_columns
namespace_id, id, instance_id, step_path, activation_id, kind, signal_name, correlation_key,
  due_at, state, signal_row_id, notified_at, seq, created_at, resolved_at, revision

-- name: wait_insert
INSERT INTO weave_waits
  (namespace_id, id, instance_id, step_path, activation_id, kind, signal_name, correlation_key,
   due_at, state, signal_row_id, notified_at, seq, created_at, resolved_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(step_path)s, %(activation_id)s, %(kind)s,
   %(signal_name)s, %(correlation_key)s, %(due_at)s, %(state)s, %(signal_row_id)s, NULL,
   %(seq)s, %(now)s, %(resolved_at)s, 1)

-- name: wait_get
SELECT {cols} FROM weave_waits
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: wait_resolve_if_open
-- Guarded on OPEN (the timer loop may have stamped notified_at meanwhile, which bumps
-- revision but leaves the wait OPEN). False = it was resolved already.
UPDATE weave_waits
SET state = %(state)s, signal_row_id = %(signal_row_id)s, resolved_at = %(now)s,
    revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'OPEN'

-- name: wait_list_open
-- Open waits of an instance (ix_weave_waits_signal).
SELECT {cols} FROM weave_waits
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s AND state = 'OPEN'
ORDER BY seq

-- name: wait_find_open_signal
-- The oldest open wait for a signal name whose correlation key the signal satisfies: a wait
-- without a key takes any signal of the name; a wait with a key only the same key.
SELECT {cols} FROM weave_waits
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s AND state = 'OPEN'
  AND signal_name = %(signal_name)s
  AND (correlation_key IS NULL OR correlation_key = %(correlation_key)s)
ORDER BY seq
LIMIT 1

-- name: wait_claim_due
-- Cross-namespace due-timer scan (allow-listed in tests/sql_guard.py): OPEN waits whose
-- due_at passed and whose timer_fired inbox event is not written yet, oldest first, on
-- ix_weave_waits_due. SKIP LOCKED gives concurrent timer loops disjoint batches; each row
-- found is then changed by its (namespace_id, id) key.
-- (Explicit columns, not the columns block: the SQL guard recognises allow-listed queries by
-- their text.)
SELECT namespace_id, id, instance_id, step_path, activation_id, kind, signal_name,
  correlation_key, due_at, state, signal_row_id, notified_at, seq, created_at, resolved_at,
  revision
FROM weave_waits
WHERE state = 'OPEN' AND notified_at IS NULL AND due_at <= %(now)s
ORDER BY due_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: wait_mark_notified_if_open
UPDATE weave_waits
SET notified_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'OPEN'
  AND notified_at IS NULL

-- name: wait_list_page
SELECT {cols} FROM weave_waits
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s
  AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s
