-- 0008: a retry policy per task. A submit may set its own backoff (initial delay, cap,
-- multiplier) instead of the queue's; the queue sets the bounds such a policy must stay
-- within (NULL = no bound of that kind beyond the API's own limits). The task keeps the
-- policy it was submitted with (pulse_tasks.retry_backoff_*, frozen at submit).
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_queues
  ADD COLUMN retry_bound_min_ms INT UNSIGNED NULL COMMENT 'a task''s own backoff_initial_ms and backoff_max_ms may not be below this; NULL = no bound',
  ADD COLUMN retry_bound_max_ms INT UNSIGNED NULL COMMENT 'a task''s own backoff_initial_ms and backoff_max_ms may not be above this; NULL = no bound',
  ADD COLUMN retry_bound_multiplier_max DOUBLE NULL COMMENT 'a task''s own backoff_multiplier may not be above this; NULL = no bound',
  ADD CONSTRAINT ck_pulse_queues_retry_bounds CHECK (
    retry_bound_min_ms IS NULL OR retry_bound_max_ms IS NULL OR retry_bound_min_ms <= retry_bound_max_ms),
  ADD CONSTRAINT ck_pulse_queues_retry_bound_multiplier CHECK (
    retry_bound_multiplier_max IS NULL OR retry_bound_multiplier_max >= 1)
