-- The operator's view of worker sessions (pulse_worker_sessions with their instance,
-- pulse_worker_instances, and the attempts they hold, pulse_attempts). Read only: closing a
-- session goes through pulse.sessions.close_session. Every query filters namespace_id first.

-- name: session_page
-- Sessions of one state by id after a cursor (index ix_pulse_worker_sessions_state), with
-- their instance's facts. %(state)s NULL = every state (then by primary key); %(queue)s
-- NULL = any queue, else only sessions that take work from it.
SELECT s.namespace_id, s.id, s.instance_id, s.application_id, s.credential_id, s.queues,
  s.max_concurrency, s.concurrency_keys, s.state, s.node_id, s.heartbeat_ms, s.lease_ms,
  s.expires_at, s.created_at, s.closed_at,
  i.host, i.pid, i.sdk, i.created_at AS instance_created_at, i.last_seen_at
FROM pulse_worker_sessions s
LEFT JOIN pulse_worker_instances i ON i.namespace_id = s.namespace_id AND i.id = s.instance_id
WHERE s.namespace_id = %(namespace_id)s
  AND (%(state)s IS NULL OR s.state = %(state)s)
  AND (%(queue)s IS NULL OR JSON_CONTAINS(s.queues, JSON_QUOTE(%(queue)s)))
  AND s.id > %(after_id)s
ORDER BY s.id
LIMIT %(limit)s

-- name: session_held_counts
-- Offered and running attempts of the given sessions (index ix_pulse_attempts_session).
SELECT session_id, state, COUNT(*) AS n
FROM pulse_attempts
WHERE namespace_id = %(namespace_id)s AND session_id IN %(session_ids)s
  AND state IN ('OFFERED', 'RUNNING')
GROUP BY session_id, state

-- name: session_held_sample
-- The first %(per_session)s attempts (by id) each of the given sessions holds: a sample for
-- the view (the counts are exact). Reads the held attempts of these sessions only (index
-- ix_pulse_attempts_session).
SELECT session_id, id, task_id, generation, state, lease_expires_at, offered_at, started_at
FROM (
  SELECT session_id, id, task_id, generation, state, lease_expires_at, offered_at, started_at,
    ROW_NUMBER() OVER (PARTITION BY session_id ORDER BY id) AS n
  FROM pulse_attempts
  WHERE namespace_id = %(namespace_id)s AND session_id IN %(session_ids)s
    AND state IN ('OFFERED', 'RUNNING')
) held
WHERE n <= %(per_session)s
ORDER BY session_id, id

-- name: session_ids_using_queue
-- Live sessions (ACTIVE and not past their expiry) that take work from queue %(queue)s: a
-- queue delete is refused while one does. At most %(limit)s ids.
SELECT id
FROM pulse_worker_sessions
WHERE namespace_id = %(namespace_id)s AND state = 'ACTIVE' AND expires_at > %(now)s
  AND JSON_CONTAINS(queues, JSON_QUOTE(%(queue)s))
ORDER BY id
LIMIT %(limit)s
