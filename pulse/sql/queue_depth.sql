-- Queue depth for /metrics (pulse/queue_gauges.py): the live usage counters plus two bounded
-- index reads per queue. Run by the background refresh of gauges, never on a scrape.

-- name: queue_depth_top
-- The queues with the most unfinished tasks, of every namespace, with their names. Reads
-- pulse_queue_usage (one row per queue, kept with every task change), never pulse_tasks.
SELECT u.namespace_id, u.queue_id, a.name AS application, n.name AS namespace,
  q.name AS queue, u.unfinished_tasks, u.reservations, u.active_attempts
FROM pulse_queue_usage u
JOIN pulse_queues q ON q.namespace_id = u.namespace_id AND q.id = u.queue_id
JOIN orbit_namespaces n ON n.id = u.namespace_id
JOIN orbit_applications a ON a.id = n.application_id
WHERE u.unfinished_tasks > 0
ORDER BY u.unfinished_tasks DESC, u.namespace_id, u.queue_id
LIMIT %(limit)s

-- name: queue_depth_needs_review_capped
-- NEEDS_REVIEW tasks of one queue, counted up to %(cap)s (an index-only range of
-- ix_pulse_tasks_fair).
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
  WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s AND state = 'NEEDS_REVIEW'
  LIMIT %(cap)s) AS r

-- name: queue_depth_oldest_waiting
-- Microseconds since the oldest due WAITING task among the first %(head)s of the queue's
-- WAITING range of ix_pulse_tasks_fair became available (NULL: none is due). That range is
-- by fairness subject, each in dispatch order: with one subject (no fairness keys, one
-- owner) and one priority, the oldest waiting task; with priorities, the oldest unless more
-- than %(head)s higher-priority tasks are ahead of it; with several subjects, the oldest of
-- the first subjects' heads.
SELECT TIMESTAMPDIFF(MICROSECOND, MIN(h.available_at), COALESCE(%(now)s, UTC_TIMESTAMP(6))) AS age_us
FROM (
  SELECT available_at FROM pulse_tasks FORCE INDEX (ix_pulse_tasks_fair)
  WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s AND state = 'WAITING'
  ORDER BY fair_subject, dispatch_at, id
  LIMIT %(head)s) AS h
WHERE h.available_at <= COALESCE(%(now)s, UTC_TIMESTAMP(6))
