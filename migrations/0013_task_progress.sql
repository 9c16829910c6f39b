-- Progress of running attempts: a handler may report a small JSON object with its
-- heartbeat (at most 4 KiB, checked by the server: pulse/progress.py); the heartbeat round
-- writes it in the same guarded UPDATEs that extend the leases, onto the attempt and onto
-- its task (with the generation it belongs to, so a new attempt does not show the previous
-- one's progress). Columns only, no index: nothing reads them but the task and attempt views.
-- Rules: docs/architecture.md (no foreign keys, comments on every column).

ALTER TABLE pulse_tasks
  ADD COLUMN progress TEXT NULL COMMENT 'JSON object last reported by a running attempt of the task (exact text); NULL until one reports',
  ADD COLUMN progress_at DATETIME(6) NULL COMMENT 'time that progress was written (database clock of its heartbeat round)',
  ADD COLUMN progress_generation INT UNSIGNED NULL COMMENT 'generation of the attempt that reported it: shown while it is the task''s latest attempt';

ALTER TABLE pulse_attempts
  ADD COLUMN progress TEXT NULL COMMENT 'JSON object last reported by this attempt with a heartbeat (exact text); NULL until it reports',
  ADD COLUMN progress_at DATETIME(6) NULL COMMENT 'time that progress was written (database clock of its heartbeat round)'
