-- A leaner write path for tasks: of the secondary indexes of pulse_tasks, every one that
-- holds `state` is rewritten at each state change (one new entry, one delete-marked; a task
-- changes state three times: offered, started, finished), and every one is written at insert.
-- Five go (three remain: ix_pulse_tasks_fair, ix_pulse_tasks_state_age,
-- ix_pulse_tasks_created), two of them into sparse tables:
--   * ix_pulse_tasks_dispatch (namespace_id, queue_id, state, dispatch_at, id): its readers
--     (counts by state, queue-wide bulk cancel, queue depth, the submit's offer check, the
--     keyed-task hint) read ix_pulse_tasks_fair (namespace_id, queue_id, state, ...), the
--     same prefix; what needs dispatch order walks it one fairness subject at a time;
--   * ix_pulse_tasks_owner (namespace_id, owner_id, state, queue_id): the bulk cancel by owner
--     reads the unfinished range of ix_pulse_tasks_state_age (a namespace's tasks are its
--     application's, or a few granted owners');
--   * uq_pulse_tasks_identity (namespace_id, owner_id, kind, pipeline_version, dedup_key)
--     becomes pulse_task_identities, one row per task WITH a dedup key (its primary key is the
--     identity, so a duplicate is refused as before), written by the submit's transaction,
--     deleted with the task by the retention purge. A task without a dedup key (most) writes
--     no identity entry at all. Backfilled from the tasks that have one;
--   * ix_pulse_tasks_deadline_due (deadline_due) and its virtual column become
--     pulse_task_deadlines, one row per task submitted WITH a deadline, written by the
--     submit's transaction. A row outlives its task's wait (no state change touches it): the
--     deadline sweep reads the rows whose deadline passed, fails the tasks still WAITING, and
--     deletes the rows of tasks that are finished, gone or no longer have that deadline.
--     Backfilled from the unfinished tasks that have a deadline.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

CREATE TABLE pulse_task_identities (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  owner_id BINARY(16) NOT NULL COMMENT 'the task''s owner (pulse_tasks.owner_id)',
  kind VARCHAR(255) NOT NULL COMMENT 'the task''s kind',
  pipeline_version VARCHAR(64) NOT NULL COMMENT 'the task''s pipeline_version',
  dedup_key VARCHAR(255) NOT NULL COMMENT 'the task''s dedup_key (tasks without one have no row)',
  task_id BINARY(16) NOT NULL COMMENT 'pulse_tasks.id of the task holding this identity',
  PRIMARY KEY (namespace_id, owner_id, kind, pipeline_version, dedup_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Task identities (owner, kind, pipeline_version, dedup_key) unique per namespace: one row per task with a dedup key';

INSERT INTO pulse_task_identities (namespace_id, owner_id, kind, pipeline_version, dedup_key, task_id)
SELECT namespace_id, owner_id, kind, pipeline_version, dedup_key, id
FROM pulse_tasks
WHERE dedup_key IS NOT NULL;

CREATE TABLE pulse_task_deadlines (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  task_id BINARY(16) NOT NULL COMMENT 'pulse_tasks.id of a task submitted with a deadline',
  deadline_at DATETIME(6) NOT NULL COMMENT 'the task''s deadline_at (not started after this time)',
  PRIMARY KEY (namespace_id, task_id),
  KEY ix_pulse_task_deadlines_due (deadline_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Deadlines of the tasks that have one: what the deadline sweep scans, deleted by it once the deadline passed and the task finished';

INSERT INTO pulse_task_deadlines (namespace_id, task_id, deadline_at)
SELECT namespace_id, id, deadline_at
FROM pulse_tasks
WHERE deadline_at IS NOT NULL AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED');

ALTER TABLE pulse_tasks
  DROP KEY uq_pulse_tasks_identity,
  DROP KEY ix_pulse_tasks_deadline_due,
  DROP COLUMN deadline_due,
  DROP KEY ix_pulse_tasks_dispatch,
  DROP KEY ix_pulse_tasks_owner,
  COMMENT='Tasks: one owner each; identity (owner, kind, pipeline_version, dedup_key) unique per namespace in pulse_task_identities'
