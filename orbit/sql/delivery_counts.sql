-- Bounded counts of open deliveries for the orbit_deliveries gauge (orbit/delivery_gauges.py).
-- Never on a scrape: a background refresh runs them at a fixed interval.

-- name: delivery_count_open_capped
-- Open deliveries of one subscription by state, each state counted up to %(cap)s rows: three
-- index-only ranges of ix_orbit_deliveries_state_seq, so the cost is bounded by the cap
-- whatever the backlog (a subscription with millions of PENDING rows costs `cap` entries).
SELECT 'PENDING' AS state, COUNT(*) AS n FROM (
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
