-- Start-time permits: the limits a start is judged by, the per-key concurrency
-- limits (pulse_concurrency_limits) with their fencing revision, and the key permits held by
-- running attempts (pulse_permits).
--
-- Lock order (docs/dispatch.md, pulse/permits.py): application resources → queue usage →
-- task/attempt → permit. The usage rows are locked by the caller (pulse.transitions
-- .lock_usage) before anything here reads them, so the plain reads of usage below see the
-- rows as locked by this transaction. Key rows are locked last, in key_digest order.
-- The queue permit is the pulse_queue_usage.active_attempts counter (no row): only key
-- permits are rows.

-- name: queue_limits_many
-- Config and usage of the queues of a start batch (usage rows already locked by the caller).
SELECT q.id, q.max_concurrency, q.max_starts_per_second,
  u.active_attempts, u.window_start, u.window_starts
FROM pulse_queues q
JOIN pulse_queue_usage u ON u.namespace_id = q.namespace_id AND u.queue_id = q.id
WHERE q.namespace_id = %(namespace_id)s AND q.id IN %(ids)s

-- name: application_limits_many
-- Quotas and usage of the owning applications (rows already locked by the caller).
SELECT application_id AS id, max_active_attempts, max_starts_per_second, active_attempts,
  window_start, window_starts
FROM orbit_application_resources
WHERE application_id IN %(ids)s

-- name: queue_window_set
-- The queue's one-second start-rate window after a batch (database clock).
UPDATE pulse_queue_usage
SET window_start = %(window_start)s, window_starts = %(window_starts)s
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: application_window_set
UPDATE orbit_application_resources
SET window_start = %(window_start)s, window_starts = %(window_starts)s
WHERE application_id = %(application_id)s

-- name: queue_denials_add
-- Start denials of a batch, by kind (never part of the queue's config revision).
UPDATE pulse_queue_usage
SET denials_permits = denials_permits + %(permits)s, denials_rate = denials_rate + %(rate)s,
  denials_key = denials_key + %(key)s,
  denials_application = denials_application + %(application)s
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: queue_denials_get
SELECT denials_quota, denials_permits, denials_rate, denials_key, denials_application
FROM pulse_queue_usage
WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: limit_lock_many
-- Lock order: LAST (after the usage rows, the tasks and the attempts), in key_digest order
-- (uq_pulse_concurrency_limits_key), so two transactions never wait crosswise on keys.
SELECT id, key_digest, concurrency_key, max_permits, held, grant_revision, revision
FROM pulse_concurrency_limits
WHERE namespace_id = %(namespace_id)s AND key_digest IN %(digests)s
ORDER BY key_digest
FOR UPDATE

-- name: limit_insert_if_absent
-- First grant of a key: create its row (held 0, grant_revision 0). Two transactions that race
-- on a new key both end up with the one row: the second waits on the first's index lock and
-- its INSERT becomes a no-op update (which still locks the row), never a duplicate-key error.
INSERT INTO pulse_concurrency_limits
  (namespace_id, id, key_digest, concurrency_key, max_permits, held, grant_revision,
   revision, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(key_digest)s, %(concurrency_key)s, 1, 0, 0, 1, %(now)s)
ON DUPLICATE KEY UPDATE revision = revision

-- name: limit_grant_if_revision
-- One more permit of the key and the next fencing token (grant_revision + 1). 0 rows = the
-- revision moved on or the key is full (held = max_permits) — with the row locked, a bug.
UPDATE pulse_concurrency_limits
SET held = held + 1, grant_revision = grant_revision + 1, revision = revision + 1,
  updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s
  AND held < max_permits

-- name: limit_release
-- Give back %(n)s permits of the key (the permit rows were deleted in this transaction).
-- held going below zero fails the statement: a drift bug to surface, never to clamp.
UPDATE pulse_concurrency_limits
SET held = held - %(n)s, revision = revision + 1, updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: permit_insert
INSERT INTO pulse_permits
  (namespace_id, id, attempt_id, kind, holder_ref, token, granted_at)
VALUES
  (%(namespace_id)s, %(id)s, %(attempt_id)s, %(kind)s, %(holder_ref)s, %(token)s, %(now)s)

-- name: permit_list_for_attempts
-- Key permits held by these attempts (uq_pulse_permits_attempt).
SELECT id, attempt_id, kind, holder_ref, token
FROM pulse_permits
WHERE namespace_id = %(namespace_id)s AND attempt_id IN %(ids)s AND kind = 'key'

-- name: permit_delete_many
DELETE FROM pulse_permits
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
