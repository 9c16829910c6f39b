-- 0004: fair dispatch (issue 5). One index on pulse_tasks so the dispatcher can share a queue
-- between its owners (applications) round-robin instead of strictly by dispatch_at:
--   * which owners have WAITING tasks in a queue, and the dispatch_at of each one's first
--     task: one ORDER BY owner_id, dispatch_at LIMIT 1 dive per owner (a skip scan walked by
--     the dispatcher), never a read of the backlog;
--   * one owner's due tasks in dispatch order: a range of this index, ORDER BY dispatch_at,
--     id LIMIT k FOR UPDATE SKIP LOCKED, so a flooding owner's backlog is never read to reach
--     another owner's tasks.
-- ix_pulse_tasks_dispatch (0002) stays for the queue-wide claim (one owner in play).
-- Rules: docs/architecture.md; the queries: pulse/sql/dispatch.sql; docs/dispatch.md.

ALTER TABLE pulse_tasks
  ADD KEY ix_pulse_tasks_owner_dispatch (namespace_id, queue_id, state, owner_id, dispatch_at, id)
