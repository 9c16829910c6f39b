-- Fair dispatch within a queue: a task may carry a fairness key (an application's own end
-- user or subject), and the node's dispatch round rotates across the subjects with due work
-- in each queue, so one flooding subject cannot delay another subject's task by more than
-- a bounded number of dispatches (docs/dispatch.md, "The node dispatch round").
--   * fairness_key: the key as given (NULL: the task's subject is its owner);
--   * fair_subject: a task's fairness subject, 16 bytes: its owner's id when it has no key,
--     else the MD5 of (owner id, key) — so a subject belongs to one owner, and two owners
--     using the same key are two subjects. VIRTUAL: computed, stored only in the index;
--   * ix_pulse_tasks_fair: the dispatch round's subject walk (one dive per subject) and its
--     per-subject claims (a range in dispatch order of one subject only). A task's subject
--     never changes, so only `state` rewrites an entry, as in ix_pulse_tasks_dispatch.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_tasks
  ADD COLUMN fairness_key VARCHAR(128) NULL COMMENT 'fair dispatch within the queue rotates across these (NULL: the owner is the subject)',
  ADD COLUMN fair_subject BINARY(16) AS (IF(fairness_key IS NULL, owner_id, UNHEX(MD5(CONCAT(HEX(owner_id), ':', fairness_key))))) VIRTUAL COMMENT 'fairness subject: owner_id, or MD5 of owner and fairness_key',
  ADD KEY ix_pulse_tasks_fair (namespace_id, queue_id, state, fair_subject, dispatch_at, id)
