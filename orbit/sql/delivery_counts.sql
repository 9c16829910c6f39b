-- Bounded counts of open deliveries for the orbit_deliveries gauge (orbit/delivery_gauges.py).
-- Never on a scrape: a background refresh runs them at a fixed interval.

-- name: delivery_count_open_capped
-- Open deliveries of one subscription by state, each state counted up to %(cap)s rows: three
-- index-only ranges of ix_orbit_deliveries_state_seq, so the cost is bounded by the cap
-- whatever the backlog (a subscription with millions of PENDING rows costs `cap` entries).
SELECT 'PENDING' AS state, LEAST(%(cap)s, COUNT(*) + (
  -- plus the result events after the subscription's hand-out cursor: they are handed out
  -- next (an upper bound when the subscription has a filter, applied at hand-out)
  SELECT GREATEST(0, COALESCE(MAX(e.last_seq), 0) - MAX(s.after_seq))
  FROM orbit_subscriptions s
  LEFT JOIN orbit_event_streams e ON e.namespace_id = s.namespace_id
  WHERE s.namespace_id = %(namespace_id)s AND s.id = %(subscription_id)s)) AS n FROM (
  SELECT 1 FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_state_seq)
  WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
    AND state = 'PENDING'
  LIMIT %(cap)s) AS p
UNION ALL
SELECT 'LEASED', LEAST(%(cap)s, COUNT(*) + (
  -- plus the open slots of LEASED delivery ranges (bounded by max_in_flight)
  SELECT COALESCE(SUM(open_n), 0)
  FROM orbit_delivery_ranges FORCE INDEX (ix_orbit_delivery_ranges_open)
  WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
    AND state = 'LEASED')) FROM (
  SELECT 1 FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_state_seq)
  WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
    AND state = 'LEASED'
  LIMIT %(cap)s) AS l
UNION ALL
SELECT 'EXHAUSTED', COUNT(*) FROM (
  SELECT 1 FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_state_seq)
  WHERE namespace_id = %(namespace_id)s AND subscription_id = %(subscription_id)s
    AND state = 'EXHAUSTED'
  LIMIT %(cap)s) AS e
