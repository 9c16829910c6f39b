-- Fewer secondary-index entries per task. A task changes state three times (offered,
-- started, finished); every index that holds `state` is rewritten at each change (one new
-- entry, one delete-marked). Two of them go:
--   * ix_pulse_tasks_lease (state, lease_expires_at): no query reads it (expired leases are
--     found on the attempts' lease index);
--   * ix_pulse_tasks_deadline (state, deadline_at) becomes an index on `deadline_due`, the
--     deadline of a WAITING task and NULL otherwise: for the tasks without a deadline (most)
--     the value stays NULL through every state change, so the index is written once, at
--     insert, and never again.
-- And orbit_result_events loses ix_orbit_result_events_task (namespace_id, task_id), which
-- no query reads: one entry less per finished task.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_tasks
  ADD COLUMN deadline_due DATETIME(6) AS (IF(state = 'WAITING', deadline_at, NULL)) VIRTUAL COMMENT 'deadline of a WAITING task (NULL otherwise): what the deadline sweep scans',
  ADD KEY ix_pulse_tasks_deadline_due (deadline_due),
  DROP KEY ix_pulse_tasks_deadline,
  DROP KEY ix_pulse_tasks_lease;

ALTER TABLE orbit_result_events
  DROP KEY ix_orbit_result_events_task
