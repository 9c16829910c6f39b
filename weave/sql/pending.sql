-- Pending advances (weave_pending_advances): events deferred while an instance was paused.
-- Every query filters namespace_id first, except the documented cross-namespace scan
-- pending_scan_resumable (tests/sql_guard.py ALLOW).

-- name: pending_columns
namespace_id, id, instance_id, inbox_id, reason, checkpoint, control_revision, state,
  created_at, resolved_at, revision

-- name: pending_insert
INSERT INTO weave_pending_advances
  (namespace_id, id, instance_id, inbox_id, reason, checkpoint, control_revision, state,
   created_at, resolved_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(inbox_id)s, %(reason)s, NULL,
   %(control_revision)s, 'PENDING', %(now)s, NULL, 1)

-- name: pending_list_for_instance
-- In the order they were recorded (ix_weave_pending_advances_instance); advances deferred by
-- one transaction share created_at, so ties follow their inbox events' arrival order.
SELECT p.namespace_id, p.id, p.instance_id, p.inbox_id, p.reason, p.checkpoint,
  p.control_revision, p.state, p.created_at, p.resolved_at, p.revision
FROM weave_pending_advances p
LEFT JOIN weave_inbox i ON i.namespace_id = p.namespace_id AND i.id = p.inbox_id
WHERE p.namespace_id = %(namespace_id)s AND p.instance_id = %(instance_id)s
  AND p.state = 'PENDING'
ORDER BY p.created_at, i.created_at, i.id, p.id
LIMIT %(limit)s

-- name: pending_resolve_if_pending
UPDATE weave_pending_advances
SET state = %(state)s, resolved_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'PENDING'

-- name: pending_discard_for_instance
-- The instance ended: what it deferred will never apply.
UPDATE weave_pending_advances
SET state = 'DISCARDED', resolved_at = %(now)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND instance_id = %(instance_id)s AND state = 'PENDING'

-- name: pending_scan_resumable
-- Cross-namespace scan (allow-listed): instances that were resumed with deferred advances
-- still to apply (a resume applies a bounded batch at once; the advancer finishes the rest).
SELECT p.namespace_id, p.instance_id
FROM weave_pending_advances p
JOIN weave_instances i ON i.namespace_id = p.namespace_id AND i.id = p.instance_id
WHERE p.state = 'PENDING' AND p.reason = 'paused' AND i.paused = 0
ORDER BY p.created_at
LIMIT %(limit)s
