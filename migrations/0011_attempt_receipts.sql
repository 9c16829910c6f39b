-- Receipts become columns of their attempt: an attempt has at most one applied report, so
-- its receipt is kept on the attempt row the report round locks and updates anyway — no
-- separate receipts row, index entry or read per report. Existing receipts are copied onto
-- their attempts, then pulse_attempt_receipts is dropped. ix_pulse_attempts_task goes too:
-- uq_pulse_attempts_generation (namespace_id, task_id, started_generation) serves the
-- attempts of a task by its prefix.
-- Rules: docs/architecture.md (no foreign keys, named CHECKs, comments on every column).

ALTER TABLE pulse_attempts
  ADD COLUMN receipt_id BINARY(16) NULL COMMENT 'receipt of the applied report (receipt_id on the wire); NULL until a report is applied',
  ADD COLUMN receipt_op ENUM('complete','fail','cancelled') NULL COMMENT 'operation of the applied report',
  ADD COLUMN receipt_digest BINARY(32) NULL COMMENT 'SHA-256 of the canonical applied report (without msg_id): an identical re-sent report gets the receipt back',
  ADD COLUMN receipt_task_state VARCHAR(16) NULL COMMENT 'task state after the report was applied',
  ADD COLUMN receipt_at DATETIME(6) NULL COMMENT 'time the report was applied',
  ADD CONSTRAINT ck_pulse_attempts_receipt CHECK (
    (receipt_id IS NULL) = (receipt_op IS NULL)
    AND (receipt_id IS NULL) = (receipt_digest IS NULL)
    AND (receipt_id IS NULL) = (receipt_task_state IS NULL)
    AND (receipt_id IS NULL) = (receipt_at IS NULL)),
  DROP KEY ix_pulse_attempts_task;

UPDATE pulse_attempts a
JOIN pulse_attempt_receipts r ON r.namespace_id = a.namespace_id AND r.attempt_id = a.id
SET a.receipt_id = r.id, a.receipt_op = r.operation, a.receipt_digest = r.request_digest,
  a.receipt_task_state = r.task_state, a.receipt_at = r.created_at;

DROP TABLE pulse_attempt_receipts
