-- Subscriptions (orbit_subscriptions): configuration (revisioned, the ETag) and the scan
-- position ``after_seq`` (not revisioned: the pump moves it, never a client).
-- Every query filters namespace_id first, except subscription_list_behind, the pump's
-- cross-namespace scan of a small configuration table.

-- name: subscription_get_by_name
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at
FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: subscription_get
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at
FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: subscription_get_by_name_for_update
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at
FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
FOR UPDATE

-- name: subscription_lock
-- Serialises everything that creates or hands out deliveries of one subscription (pump,
-- lease, lease expiry). Ack, nack and budget lock only their delivery row.
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at
FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: subscription_lock_keys
-- A node round of hand-outs: the subscriptions of several namespaces locked in ONE
-- statement, in (namespace, id) order (the one (namespace_id, id IN …) group written
-- here becomes one group per namespace, OR-ed: store.deliveries.expand_keys). db_now: the
-- database clock once the row is locked (orbit.store.clock.clock_of).
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at, SYSDATE(6) AS db_now
FROM orbit_subscriptions
WHERE ((namespace_id = %s AND id IN (/*ids*/)))
ORDER BY namespace_id, id
FOR UPDATE

-- name: subscription_lock_skip_locked
-- The background loop's lock: a subscription another node (or a consumer) is working on
-- right now is skipped, not waited for.
SELECT namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
  max_in_flight, revision, created_at, updated_at
FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE SKIP LOCKED

-- name: subscription_insert
INSERT INTO orbit_subscriptions
  (namespace_id, id, name, filter, start_spec, after_seq, ack_timeout_ms, max_deliveries,
   max_in_flight, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(name)s, %(filter)s, %(start_spec)s, %(after_seq)s,
   %(ack_timeout_ms)s, %(max_deliveries)s, %(max_in_flight)s, 1,
   COALESCE(%(now)s, UTC_TIMESTAMP(6)), COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: subscription_update_if_revision
-- Config update. The scan position is deliberately not touched.
UPDATE orbit_subscriptions
SET filter = %(filter)s, ack_timeout_ms = %(ack_timeout_ms)s,
  max_deliveries = %(max_deliveries)s, max_in_flight = %(max_in_flight)s,
  revision = revision + 1, updated_at = COALESCE(%(now)s, UTC_TIMESTAMP(6))
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: subscription_advance_if_position
-- Moves the scan position forward. Guarded by the old position (a second line of defence
-- behind the row lock): 0 rows means another pump moved it, and the caller rolls back.
UPDATE orbit_subscriptions
SET after_seq = %(new_seq)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND after_seq = %(old_seq)s
  AND %(new_seq)s > %(old_seq)s

-- name: subscription_list_behind
-- Subscriptions whose position is behind their namespace's stream: the pump's work list.
SELECT s.namespace_id, s.id, s.after_seq, e.last_seq
FROM orbit_subscriptions s
JOIN orbit_event_streams e ON e.namespace_id = s.namespace_id
WHERE s.after_seq < e.last_seq
ORDER BY s.namespace_id, s.id
LIMIT %(limit)s

-- name: subscription_stream_tops
-- The result stream position of the namespaces this node's consumers watch: one primary-key
-- read a delivery-loop round, whatever the number of streams (the loop wakes the consumers
-- of a namespace whose position moved; nothing polls per stream).
SELECT namespace_id, last_seq
FROM orbit_event_streams
WHERE namespace_id IN %(namespace_ids)s

-- name: subscription_streams_moved
-- The stream positions of the watched namespaces whose stream moved in the last
-- %(window_s)s seconds (by the stream row's updated_at): what a delivery-loop round reads
-- between its full reads (subscription_stream_tops), so a quiet node decodes no rows.
SELECT namespace_id, last_seq
FROM orbit_event_streams
WHERE namespace_id IN %(namespace_ids)s
  AND updated_at >= UTC_TIMESTAMP(6) - INTERVAL %(window_s)s SECOND

-- name: subscription_list_page
-- Every subscription, in (namespace_id, id) order after a key, for the lease-expiry sweep.
SELECT namespace_id, id
FROM orbit_subscriptions
WHERE (namespace_id, id) > (%(after_namespace_id)s, %(after_id)s)
ORDER BY namespace_id, id
LIMIT %(limit)s


-- name: subscription_delete_if_revision
-- Delete a subscription (its deliveries stay as history). 0 rows = the revision moved on.
DELETE FROM orbit_subscriptions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: subscription_count_of_application
-- The subscriptions of every namespace of one application, counted up to %(cap)s (the
-- application's max_subscriptions quota, checked at creation): at most cap index entries.
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM orbit_subscriptions
  WHERE namespace_id IN (SELECT id FROM orbit_namespaces WHERE application_id = %(application_id)s)
  LIMIT %(cap)s
) AS counted

-- name: subscription_cursors
-- Retention: every subscription's hand-out cursor (result events after it are kept).
SELECT id, after_seq FROM orbit_subscriptions WHERE namespace_id = %(namespace_id)s
