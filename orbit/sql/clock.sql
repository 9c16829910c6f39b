-- The database clock: the one time leases, deadlines, expiry and event stamps are judged by.

-- name: clock_now
-- %(now)s pins it (tests); NULL reads the server's UTC clock.
SELECT COALESCE(%(now)s, UTC_TIMESTAMP(6)) AS now
