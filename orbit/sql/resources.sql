-- Application resources (orbit_application_resources): quotas (config, revisioned) and usage
-- counters (not revisioned). First in the lock order: application resources, queue,
-- task/attempt, permit.

-- name: resources_insert
INSERT INTO orbit_application_resources
  (application_id, max_unfinished_tasks, max_active_attempts, max_reservations,
   max_starts_per_second, revision, unfinished_tasks, active_attempts, reservations,
   window_start, window_starts, created_at, updated_at)
VALUES
  (%(application_id)s, NULL, NULL, NULL, NULL, 1, 0, 0, 0, NULL, 0,
   COALESCE(%(now)s, UTC_TIMESTAMP(6)), COALESCE(%(now)s, UTC_TIMESTAMP(6)))

-- name: resources_get
SELECT application_id, max_unfinished_tasks, max_active_attempts, max_reservations,
  max_starts_per_second, max_subscriptions, revision, unfinished_tasks, active_attempts, reservations,
  window_start, window_starts, created_at, updated_at
FROM orbit_application_resources
WHERE application_id = %(application_id)s

-- name: resources_get_for_update
SELECT application_id, max_unfinished_tasks, max_active_attempts, max_reservations,
  max_starts_per_second, max_subscriptions, revision, unfinished_tasks, active_attempts, reservations,
  window_start, window_starts, created_at, updated_at
FROM orbit_application_resources
WHERE application_id = %(application_id)s
FOR UPDATE

-- name: resources_update_config_if_revision
-- Changes only the quota config: usage columns are untouched and never bump revision.
UPDATE orbit_application_resources
SET max_unfinished_tasks = %(max_unfinished_tasks)s,
  max_active_attempts = %(max_active_attempts)s,
  max_reservations = %(max_reservations)s,
  max_starts_per_second = %(max_starts_per_second)s,
  max_subscriptions = %(max_subscriptions)s,
  revision = revision + 1,
  updated_at = COALESCE(%(now)s, UTC_TIMESTAMP(6))
WHERE application_id = %(application_id)s AND revision = %(revision)s
