-- Schedules (pulse_schedules), their immutable versions (pulse_schedule_versions) and
-- occurrences (pulse_schedule_occurrences). Every query filters namespace_id first, except
-- schedule_claim_due: the scheduler's cross-namespace scan (allow-listed in
-- tests/sql_guard.py), which locks one due row and is followed by per-row work keyed by
-- (namespace_id, id).
--
-- Lock order: the schedule row first (FOR UPDATE), then whatever task submission locks
-- (application resources -> queue usage -> tasks -> result stream). Nothing else locks
-- schedule rows.

-- name: schedule_columns
namespace_id, id, name, owner_id, current_version, paused, control_revision, check_at,
  covered_until, last_task_id, buffered_fire_at, buffered_version, revision, created_at,
  updated_at

-- name: schedule_get_by_name
SELECT {cols}
FROM pulse_schedules
WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: schedule_get_by_name_for_update
SELECT {cols}
FROM pulse_schedules
WHERE namespace_id = %(namespace_id)s AND name = %(name)s
FOR UPDATE

-- name: schedule_list_after
SELECT {cols}
FROM pulse_schedules
WHERE namespace_id = %(namespace_id)s AND name > %(after_name)s
ORDER BY name
LIMIT %(limit)s

-- name: schedule_claim_due
-- The scheduler's scan over every namespace (index ix_pulse_schedules_due (paused,
-- check_at)): the most overdue unpaused schedule whose row no other scheduler holds. The
-- row stays locked until the caller's transaction ends, so each due schedule is worked on
-- by one node at a time; the others skip it. (Columns spelled out: the SQL guard
-- recognises this allow-listed query by its exact text.)
SELECT namespace_id, id, name, owner_id, current_version, paused, control_revision, check_at,
  covered_until, last_task_id, buffered_fire_at, buffered_version, revision, created_at,
  updated_at
FROM pulse_schedules
WHERE paused = 0 AND check_at <= %(now)s
ORDER BY check_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: schedule_insert
INSERT INTO pulse_schedules
  (namespace_id, id, name, owner_id, current_version, paused, control_revision, check_at,
   covered_until, revision, created_at, updated_at)
VALUES
  (%(namespace_id)s, %(id)s, %(name)s, %(owner_id)s, 1, 0, 1, %(check_at)s,
   %(covered_until)s, 1, %(now)s, %(now)s)

-- name: schedule_publish_if_revision
-- A new current version (PUT): bumps revision (the ETag). 0 rows = the revision moved on.
UPDATE pulse_schedules
SET current_version = %(version)s,
  check_at = %(check_at)s,
  revision = revision + 1,
  updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: schedule_progress_if_covered
-- Scheduler progress: covered_until only moves forward, guarded by its previous value (the
-- row is locked; the guard makes a lost update impossible anyway), with the overlap state
-- (the previous run, the fire time buffer_one holds back). Progress is not configuration:
-- revision (the ETag) stays.
UPDATE pulse_schedules
SET covered_until = %(covered_until)s,
  check_at = %(check_at)s,
  last_task_id = %(last_task_id)s,
  buffered_fire_at = %(buffered_fire_at)s,
  buffered_version = %(buffered_version)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
  AND covered_until = %(old_covered_until)s AND covered_until <= %(covered_until)s

-- name: schedule_defer_if_check
-- Push a schedule's next look into the future (a round that failed, or a task the queue's
-- quota refused): the scan then serves other schedules first. 0 rows = check_at moved on.
UPDATE pulse_schedules
SET check_at = %(check_at)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND check_at = %(old_check_at)s

-- name: schedule_set_paused_if_control
-- Pause or resume: bumps control_revision (not revision). 0 rows = the control revision
-- moved on.
UPDATE pulse_schedules
SET paused = %(paused)s,
  control_revision = control_revision + 1,
  covered_until = GREATEST(covered_until, %(covered_until)s),
  check_at = %(check_at)s,
  updated_at = %(now)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s
  AND control_revision = %(control_revision)s

-- name: version_columns
namespace_id, id, schedule_id, version, queue_name, cron, every_ms, timezone,
  tzdata_version, task_kind, task_payload, task_priority, task_pipeline_version, task_options,
  catchup_window_ms, grace_ms, start_at, end_at, overlap, created_at

-- name: version_insert
INSERT INTO pulse_schedule_versions
  (namespace_id, id, schedule_id, version, queue_name, cron, every_ms, timezone,
   tzdata_version, task_kind, task_payload, task_priority, task_pipeline_version,
   task_options, catchup_window_ms, grace_ms, start_at, end_at, overlap, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(schedule_id)s, %(version)s, %(queue_name)s, %(cron)s,
   %(every_ms)s, %(timezone)s, %(tzdata_version)s, %(task_kind)s, %(task_payload)s,
   %(task_priority)s, %(task_pipeline_version)s, %(task_options)s, %(catchup_window_ms)s,
   %(grace_ms)s, %(start_at)s, %(end_at)s, %(overlap)s, %(created_at)s)

-- name: version_get
SELECT {vcols}
FROM pulse_schedule_versions
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND version = %(version)s

-- name: version_at
-- The version governing fire time %(at)s: the last one published at or before it (the
-- first version when none was, which only happens for times before the schedule existed).
SELECT COALESCE(MAX(version), 1) AS version
FROM pulse_schedule_versions
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND created_at <= %(at)s

-- name: version_list_from
SELECT {vcols}
FROM pulse_schedule_versions
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND version >= %(from_version)s
ORDER BY version
LIMIT %(limit)s

-- name: occurrence_columns
namespace_id, id, schedule_id, fire_at, fire_at_local, version, task_id, outcome, late,
  covered_until, skipped_count, reason, origin, trigger_key, created_at

-- name: occurrence_insert
INSERT INTO pulse_schedule_occurrences
  (namespace_id, id, schedule_id, fire_at, fire_at_local, version, task_id, outcome, late,
   covered_until, skipped_count, reason, origin, trigger_key, created_at)
VALUES
  (%(namespace_id)s, %(id)s, %(schedule_id)s, %(fire_at)s, %(fire_at_local)s, %(version)s,
   %(task_id)s, %(outcome)s, %(late)s, %(covered_until)s, %(skipped_count)s, %(reason)s,
   %(origin)s, %(trigger_key)s, %(created_at)s)

-- name: occurrence_list_before
-- Newest first (index ix_pulse_schedule_occurrences_fire, whose rows end with the primary
-- key): fire times before %(before)s, or equal to it with a smaller id (the cursor of the
-- previous page); %(outcome)s NULL = any.
SELECT {ocols}
FROM pulse_schedule_occurrences
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND (fire_at < %(before)s OR (fire_at = %(before)s AND id < %(before_id)s))
  AND (%(outcome)s IS NULL OR outcome = %(outcome)s)
ORDER BY fire_at DESC, id DESC
LIMIT %(limit)s

-- name: occurrence_get_by_trigger_key
-- The occurrence a trigger with this idempotency key created (index
-- uq_pulse_schedule_occurrences_trigger).
SELECT {ocols}
FROM pulse_schedule_occurrences
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND trigger_key = %(trigger_key)s

-- name: occurrence_slots_between
-- Fire times in [%(lo)s, %(hi)s) that already created a task from the cadence (scheduled
-- or backfilled; index uq_pulse_schedule_occurrences_slot): a backfill skips them.
SELECT fire_slot
FROM pulse_schedule_occurrences
WHERE namespace_id = %(namespace_id)s AND schedule_id = %(schedule_id)s
  AND fire_slot >= %(lo)s AND fire_slot < %(hi)s
ORDER BY fire_slot
LIMIT %(limit)s

-- name: schedule_set_last_task
-- A trigger's task becomes the previous run (the row is locked by the caller). Not
-- configuration: revision stays.
UPDATE pulse_schedules
SET last_task_id = %(task_id)s
WHERE namespace_id = %(namespace_id)s AND id = %(id)s

-- name: schedule_delete_if_revision
-- Delete a schedule row (its versions and occurrences stay as history). 0 rows = the
-- revision moved on.
DELETE FROM pulse_schedules
WHERE namespace_id = %(namespace_id)s AND id = %(id)s AND revision = %(revision)s

-- name: schedule_names_for_queue
-- Schedules whose current version sends tasks to queue %(queue_name)s (a queue delete is
-- refused while one does); at most %(limit)s names.
SELECT s.name
FROM pulse_schedules s
JOIN pulse_schedule_versions v
  ON v.namespace_id = s.namespace_id AND v.schedule_id = s.id AND v.version = s.current_version
WHERE s.namespace_id = %(namespace_id)s AND v.queue_name = %(queue_name)s
ORDER BY s.name
LIMIT %(limit)s
