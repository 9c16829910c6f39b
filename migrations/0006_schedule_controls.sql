-- 0006: schedule controls. A schedule can be fired by hand (trigger, idempotent with a key)
-- and backfilled over a past range, and each version carries an overlap policy that decides
-- what a fire time does while the schedule's previous run is unfinished.
--   * pulse_schedule_versions.overlap: allow, skip, buffer_one or cancel_previous.
--   * pulse_schedules: the previous run (last_task_id) and the fire time buffer_one holds
--     back until that run finishes (buffered_fire_at, buffered_version).
--   * pulse_schedule_occurrences: where an occurrence came from (origin) and a trigger's
--     idempotency key. A fire time produces at most one task: the unique key moves from
--     fire_at to fire_slot, which is the fire time of an occurrence that created a task from
--     the cadence (scheduled or backfilled) and NULL otherwise. So a backfill can fill a fire
--     time that was recorded as skipped, never one that already ran, and a trigger (at the
--     time it was asked for) never takes a fire time of the cadence.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_schedule_versions
  ADD COLUMN overlap ENUM('allow','skip','buffer_one','cancel_previous') NOT NULL DEFAULT 'allow' COMMENT 'what a fire time does while the previous run is unfinished: allow, skip, buffer_one or cancel_previous';

ALTER TABLE pulse_schedules
  ADD COLUMN last_task_id BINARY(16) NULL COMMENT 'task of the latest scheduled or triggered occurrence: the previous run overlap policies look at',
  ADD COLUMN buffered_fire_at DATETIME(6) NULL COMMENT 'buffer_one: a fire time held back until the previous run finishes; NULL = none',
  ADD COLUMN buffered_version INT UNSIGNED NULL COMMENT 'version governing buffered_fire_at';

ALTER TABLE pulse_schedule_occurrences
  ADD COLUMN origin ENUM('schedule','trigger','backfill') NOT NULL DEFAULT 'schedule' COMMENT 'schedule (the scheduler), trigger (fired by hand) or backfill (a past range filled in)',
  ADD COLUMN trigger_key VARCHAR(128) NULL COMMENT 'idempotency key of a trigger: one occurrence per key and schedule';

ALTER TABLE pulse_schedule_occurrences
  ADD COLUMN fire_slot DATETIME(6) AS (IF(origin <> 'trigger' AND outcome = 'created', fire_at, NULL)) STORED COMMENT 'fire time of an occurrence that created a task from the cadence; unique per schedule';

ALTER TABLE pulse_schedule_occurrences
  MODIFY COLUMN fire_at DATETIME(6) NOT NULL COMMENT 'UTC fire time (for a trigger: the time it was asked for)',
  MODIFY COLUMN outcome ENUM('created','skipped') NOT NULL COMMENT 'created a task, or skipped (reason says why)',
  DROP KEY uq_pulse_schedule_occurrences_fire,
  ADD KEY ix_pulse_schedule_occurrences_fire (namespace_id, schedule_id, fire_at),
  ADD UNIQUE KEY uq_pulse_schedule_occurrences_slot (namespace_id, schedule_id, fire_slot),
  ADD UNIQUE KEY uq_pulse_schedule_occurrences_trigger (namespace_id, schedule_id, trigger_key),
  COMMENT='Schedule occurrences: at most one task per (schedule, UTC fire time) of the cadence'
