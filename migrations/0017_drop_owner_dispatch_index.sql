-- One secondary-index entry fewer per task insert and three fewer per task (its `state` is
-- rewritten at each change: offered, started, finished): ix_pulse_tasks_owner_dispatch
-- (namespace_id, queue_id, state, owner_id, dispatch_at, id) goes. Every dispatch is a node
-- dispatch round, whose look and claim read ix_pulse_tasks_fair (a task's fairness subject is
-- its owner when it has no fairness key); no query reads the per-owner index any more.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_tasks
  DROP KEY ix_pulse_tasks_owner_dispatch
