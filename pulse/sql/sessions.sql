-- Worker instances (pulse_worker_instances) and sessions (pulse_worker_sessions).
-- Every query filters namespace_id first, except the allow-listed recovery scan
-- session_list_expired (cross-namespace, on ix_pulse_worker_sessions_expiry).

-- name: instance_get
SELECT namespace_id, id, application_id, host, pid, sdk, created_at, last_seen_at, revision
FROM pulse_worker_instances
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: instance_lock
SELECT namespace_id, id, application_id, host, pid, sdk, created_at, last_seen_at, revision
FROM pulse_worker_instances
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: instance_insert
INSERT INTO pulse_worker_instances
  (namespace_id, id, application_id, host, pid, sdk, created_at, last_seen_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(application_id)s, %(host)s, %(pid)s, %(sdk)s, %(now)s, %(now)s, 1)

-- name: instance_update_if_revision
-- A worker process re-registering (same instance id): new host/pid/sdk facts, seen now.
UPDATE pulse_worker_instances
SET host = %(host)s, pid = %(pid)s, sdk = %(sdk)s, last_seen_at = %(now)s,
  revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: instance_touch
-- last_seen_at only moves forward (two sessions of one instance heartbeat independently).
UPDATE pulse_worker_instances
SET last_seen_at = GREATEST(last_seen_at, %(now)s), revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: session_insert
INSERT INTO pulse_worker_sessions
  (namespace_id, id, instance_id, application_id, credential_id, token_digest, queues,
   max_concurrency, concurrency_keys, state, node_id, heartbeat_ms, lease_ms, expires_at,
   created_at, closed_at, revision)
VALUES
  (%(namespace_id)s, %(id)s, %(instance_id)s, %(application_id)s, %(credential_id)s,
   %(token_digest)s, %(queues)s, %(max_concurrency)s, %(concurrency_keys)s, 'ACTIVE', NULL,
   %(heartbeat_ms)s, %(lease_ms)s, %(expires_at)s, %(now)s, NULL, 1)

-- name: session_get
SELECT namespace_id, id, instance_id, application_id, credential_id, token_digest, queues,
  max_concurrency, concurrency_keys, state, node_id, heartbeat_ms, lease_ms, expires_at,
  created_at, closed_at, revision
FROM pulse_worker_sessions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: session_lock
-- Lock order: the session row comes before application resources, queues, tasks, attempts.
SELECT namespace_id, id, instance_id, application_id, credential_id, token_digest, queues,
  max_concurrency, concurrency_keys, state, node_id, heartbeat_ms, lease_ms, expires_at,
  created_at, closed_at, revision
FROM pulse_worker_sessions
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
FOR UPDATE

-- name: session_get_for_auth
-- Everything a session-token request is judged by, in one read: the session, its
-- namespace's name, the credential that opened it and its application's status.
SELECT s.namespace_id, s.id, s.instance_id, s.application_id, s.credential_id, s.token_digest,
  s.queues, s.max_concurrency, s.concurrency_keys, s.state, s.node_id, s.heartbeat_ms,
  s.lease_ms, s.expires_at, s.revision,
  n.name AS namespace_name,
  c.revoked_at AS credential_revoked_at, c.expires_at AS credential_expires_at,
  a.status AS application_status,
  CAST(COALESCE(%(now)s, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS db_now
FROM pulse_worker_sessions s
JOIN orbit_namespaces n ON n.id = s.namespace_id
LEFT JOIN orbit_credentials c ON c.id = s.credential_id
LEFT JOIN orbit_applications a ON a.id = s.application_id
WHERE s.namespace_id = %(namespace_id)s AND s.id = %(id)s

-- name: session_extend_if_active
-- Heartbeat: the session lives lease_ms past now. 0 rows = expired or closed (or past its
-- expiry and waiting for recovery): a dead session is never revived.
UPDATE pulse_worker_sessions
SET expires_at = %(expires_at)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'ACTIVE'
  AND expires_at > %(now)s

-- name: session_attach_node
-- The stream (or long-poll) of the session is now held by node_id; offers come only from it.
UPDATE pulse_worker_sessions
SET node_id = %(node_id)s, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'ACTIVE'

-- name: session_detach_node_if_node
-- Only the node that holds the stream clears it (a newer node may have taken over).
UPDATE pulse_worker_sessions
SET node_id = NULL, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND node_id = %(node_id)s

-- name: session_list_expired
-- Allow-listed cross-namespace recovery scan on ix_pulse_worker_sessions_expiry.
SELECT namespace_id, id
FROM pulse_worker_sessions
WHERE state = 'ACTIVE' AND expires_at <= %(now)s
ORDER BY expires_at
LIMIT %(limit)s

-- name: session_expire_if_due
-- 0 rows = another node expired it first, or a heartbeat extended it meanwhile.
UPDATE pulse_worker_sessions
SET state = 'EXPIRED', closed_at = %(now)s, node_id = NULL, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'ACTIVE'
  AND expires_at <= %(now)s

-- name: session_lock_offer_skip_locked
-- The waiting sessions a submit may offer its new task to (pulse/submit_offer.py), locked
-- only when free: a submit holds usage rows already, and dispatch locks sessions before
-- them, so a submit never waits for a session row (SKIP LOCKED: one being served is left).
-- db_now: the database clock once the row is locked (orbit.store.clock.clock_of).
SELECT id, state, node_id, max_concurrency, expires_at, SYSDATE(6) AS db_now
FROM pulse_worker_sessions
WHERE namespace_id = %(namespace_id)s AND id IN %(ids)s
ORDER BY id
FOR UPDATE SKIP LOCKED

-- name: session_count_held_many
-- Flow control of several sessions: the attempts each holds (offered or running).
SELECT session_id, COUNT(*) AS n
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND session_id IN %(ids)s
  AND state IN ('OFFERED', 'RUNNING')
GROUP BY session_id

-- name: session_queue_has_due_work
-- Whether a queue has a due WAITING task other than ``ids`` (the tasks a submit just made):
-- a submit offers its own task only when nothing older or more urgent is due. A bounded
-- read of the queue's WAITING range of ix_pulse_tasks_fair (by fairness subject, each in
-- dispatch order, so a subject's due tasks come before its later ones): at most %(scan)s
-- entries, never a backlog that is not due. ``due``: a due task other than ``ids`` among
-- them; ``n`` = %(scan)s: the read stopped before the range's end (the caller counts that as
-- due work: the round dispatches it).
SELECT COUNT(*) AS n,
  COALESCE(SUM(h.dispatch_at <= %(now)s AND h.id NOT IN %(ids)s), 0) AS due
FROM (
  SELECT dispatch_at, id FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
  WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s AND state = 'WAITING'
  ORDER BY fair_subject, dispatch_at, id
  LIMIT %(scan)s) AS h

-- name: session_list_held
-- Attempts the session holds, for recovery after the session ends.
SELECT namespace_id, id, task_id, state
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND session_id = %(session_id)s
  AND state IN ('OFFERED', 'RUNNING')
ORDER BY id
LIMIT %(limit)s

-- name: session_list_offered
-- Outstanding offers of a session (re-sent when its stream reconnects), with the task
-- fields of an offer frame.
SELECT a.id AS attempt_id, a.generation, a.lease_expires_at AS attempt_lease_expires_at,
  t.id, t.queue_name, t.kind, t.payload, t.priority, t.deadline_at, t.concurrency_key
FROM pulse_attempts a
JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id
WHERE a.namespace_id = %(namespace_id)s AND a.session_id = %(session_id)s
  AND a.state = 'OFFERED' AND a.lease_expires_at > %(now)s
ORDER BY a.offered_at, a.id

-- name: session_close_if_active
-- The worker closes its session (graceful drain): ACTIVE → CLOSED. 0 rows = already ended.
UPDATE pulse_worker_sessions
SET state = 'CLOSED', closed_at = %(now)s, node_id = NULL, revision = revision + 1
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND state = 'ACTIVE'

-- name: session_keyed_waiting
-- Whether keyed tasks are among the next due tasks of a queue (told to a session that does
-- not accept keyed tasks when it is created). Bounded: at most the first 1000 WAITING rows
-- of the queue on ix_pulse_tasks_fair (by fairness subject, each in dispatch order: with one
-- subject, the queue's dispatch order), never the whole backlog.
SELECT 1 FROM (
  SELECT concurrency_key_digest FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
  WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s AND state = 'WAITING'
  ORDER BY fair_subject, dispatch_at, id
  LIMIT 1000
) due
WHERE due.concurrency_key_digest IS NOT NULL
LIMIT 1
