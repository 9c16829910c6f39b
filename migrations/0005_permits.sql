-- 0005: start-time permits (issue 5). Two more denial counters on the queue usage row, so
-- every kind of start denial is counted where the queue's GET shows it:
--   denials_permits (0002)     the queue's max_concurrency
--   denials_rate (0002)        the queue's or the owning application's start-rate window
--   denials_key                the task's concurrency key was held (or its token space spent)
--   denials_application        the owning application's max_active_attempts
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_queue_usage
  ADD COLUMN denials_key BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'starts refused because the concurrency key was held (key_busy) or its token space was spent (key_exhausted)',
  ADD COLUMN denials_application BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'starts refused by the max_active_attempts of the owning application';
