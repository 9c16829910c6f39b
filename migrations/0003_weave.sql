-- 0003_weave.sql: Weave, the workflow engine (weave_*).
--
-- Rules (docs/architecture.md, "Schema rules"): runtime rows have PRIMARY KEY (namespace_id, id),
-- ids BINARY(16), times DATETIME(6) UTC written by the application, revision on mutable rows,
-- a COMMENT on every table and column, CHECKs named ck_<table>_<rule> (unique across the schema),
-- zero foreign keys (relations are indexed columns checked by the service in the same
-- transaction), immutable history guarded by BEFORE UPDATE/DELETE SIGNAL triggers.
-- Business JSON (definitions, inputs, outputs, results, payloads) is MEDIUMTEXT kept byte-exact
-- with a JSON_VALID check. Names are case-sensitive, so every table uses utf8mb4_bin.
-- step_path is the step id of the definition (step ids are unique in a definition and, with no
-- cycles except inside poll, each step runs at most once per instance). The column is wide
-- enough for a future path form. Documented in docs/schema-weave.md.
-- Statements are split on semicolons outside quotes and comments: never put one in a comment.

CREATE TABLE weave_definitions (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace (orbit_namespaces.id)',
  id BINARY(16) NOT NULL COMMENT 'Definition id (128-bit random)',
  name VARCHAR(63) NOT NULL COMMENT 'Workflow name, unique and case-sensitive within the namespace (API.md names rule)',
  owner_id BINARY(16) NOT NULL COMMENT 'Application that first published the workflow',
  latest_version INT UNSIGNED NOT NULL COMMENT 'Highest published version number (1, 2, ...). Bumped with each publish under the row lock',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, starts at 1, bumped by every publish',
  created_at DATETIME(6) NOT NULL COMMENT 'First publish time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last publish time (UTC)',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_definitions_name (namespace_id, name),
  CONSTRAINT ck_weave_definitions_name CHECK (name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_weave_definitions_latest_version CHECK (latest_version >= 1),
  CONSTRAINT ck_weave_definitions_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Workflow definitions: one row per workflow name, pointing at its latest immutable version';

CREATE TABLE weave_definition_versions (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Version row id',
  definition_id BINARY(16) NOT NULL COMMENT 'weave_definitions.id',
  version INT UNSIGNED NOT NULL COMMENT 'Version number, 1, 2, ... per definition, gap-free',
  definition MEDIUMTEXT NOT NULL COMMENT 'The definition JSON text exactly as submitted (byte-exact)',
  definition_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the canonical JSON form (sorted keys, compact) used to detect an unchanged republish',
  language_version SMALLINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'Version of the definition language the text was validated against',
  step_count INT UNSIGNED NOT NULL COMMENT 'Number of steps (all sequences and branches), for listings',
  published_by BINARY(16) NULL COMMENT 'Credential that published it, NULL when published without one (CLI, tests)',
  created_at DATETIME(6) NOT NULL COMMENT 'Publish time (UTC)',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_definition_versions_version (namespace_id, definition_id, version),
  KEY ix_weave_definition_versions_digest (namespace_id, definition_id, definition_digest),
  CONSTRAINT ck_weave_definition_versions_version CHECK (version >= 1),
  CONSTRAINT ck_weave_definition_versions_json CHECK (JSON_VALID(definition) AND JSON_TYPE(definition) = 'OBJECT'),
  CONSTRAINT ck_weave_definition_versions_steps CHECK (step_count >= 1),
  CONSTRAINT ck_weave_definition_versions_language CHECK (language_version >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Immutable, validated workflow definition versions. Instances keep the version they started with';

CREATE TRIGGER trg_weave_definition_versions_no_update BEFORE UPDATE ON weave_definition_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_definition_versions is immutable';

CREATE TRIGGER trg_weave_definition_versions_no_delete BEFORE DELETE ON weave_definition_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_definition_versions is immutable';

CREATE TABLE weave_instances (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Instance id',
  owner_id BINARY(16) NOT NULL COMMENT 'Application that started the instance; owner of every task it creates',
  definition_id BINARY(16) NOT NULL COMMENT 'weave_definitions.id',
  definition_name VARCHAR(63) NOT NULL COMMENT 'Workflow name, kept for snapshots and filters (names never change)',
  version INT UNSIGNED NOT NULL COMMENT 'Definition version the instance runs, fixed for its whole life',
  business_key VARCHAR(255) NULL COMMENT 'Idempotent start key, unique per definition when not NULL',
  input MEDIUMTEXT NOT NULL COMMENT 'Input JSON text exactly as submitted',
  output MEDIUMTEXT NULL COMMENT 'Output JSON text, set exactly when the instance SUCCEEDED',
  error JSON NULL COMMENT 'Error object (code, message, step) when FAILED, or the reason of CANCELLED',
  state VARCHAR(16) NOT NULL COMMENT 'RUNNING, SUCCEEDED, FAILED or CANCELLED',
  paused TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = paused: events are recorded as pending advances and applied on resume',
  control_revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'Bumped by every pause, resume and cancel (separate from revision)',
  history_seq BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Last history position handed out to a step, activation or wait of this instance',
  created_by BINARY(16) NULL COMMENT 'Credential that started it, NULL when none',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped by every advance and control change',
  created_at DATETIME(6) NOT NULL COMMENT 'Start time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last change (UTC)',
  finished_at DATETIME(6) NULL COMMENT 'Time the instance reached a terminal state',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_instances_business_key (namespace_id, definition_id, business_key),
  KEY ix_weave_instances_definition (namespace_id, definition_id, state, created_at),
  KEY ix_weave_instances_owner (namespace_id, owner_id, state),
  KEY ix_weave_instances_created (namespace_id, created_at, id),
  CONSTRAINT ck_weave_instances_state CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
  CONSTRAINT ck_weave_instances_finished CHECK ((state = 'RUNNING') = (finished_at IS NULL)),
  CONSTRAINT ck_weave_instances_output CHECK ((state = 'SUCCEEDED') = (output IS NOT NULL)),
  CONSTRAINT ck_weave_instances_failed_error CHECK (state <> 'FAILED' OR error IS NOT NULL),
  CONSTRAINT ck_weave_instances_paused CHECK (paused IN (0, 1)),
  CONSTRAINT ck_weave_instances_paused_running CHECK (paused = 0 OR state = 'RUNNING'),
  CONSTRAINT ck_weave_instances_input_json CHECK (JSON_VALID(input)),
  CONSTRAINT ck_weave_instances_output_json CHECK (output IS NULL OR JSON_VALID(output)),
  CONSTRAINT ck_weave_instances_error_json CHECK (error IS NULL OR JSON_VALID(error)),
  CONSTRAINT ck_weave_instances_business_key CHECK (business_key IS NULL OR CHAR_LENGTH(business_key) BETWEEN 1 AND 255),
  CONSTRAINT ck_weave_instances_version CHECK (version >= 1),
  CONSTRAINT ck_weave_instances_revision CHECK (revision >= 1 AND control_revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Workflow instances: one run of one definition version, owned by the starting application';

CREATE TABLE weave_steps (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Step row id',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  step_path VARCHAR(255) NOT NULL COMMENT 'Step id in the definition (see the file header)',
  step_type VARCHAR(16) NOT NULL COMMENT 'Step type copied from the definition',
  state VARCHAR(16) NOT NULL COMMENT 'RUNNING, SUCCEEDED, TIMED_OUT (wait timeout or poll exhausted), FAILED or CANCELLED',
  next_step VARCHAR(255) NULL COMMENT 'Step the instance went to from here (a transition), NULL at the end of a sequence or while running',
  activations INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Activations made for this step so far (poll rounds count one each)',
  output MEDIUMTEXT NULL COMMENT 'Step output JSON text (task result, signal payload, last poll result)',
  error JSON NULL COMMENT 'Error object when the step FAILED or TIMED_OUT',
  seq BIGINT UNSIGNED NOT NULL COMMENT 'History position of the step entry (weave_instances.history_seq)',
  started_at DATETIME(6) NOT NULL COMMENT 'Time the step was entered (UTC)',
  finished_at DATETIME(6) NULL COMMENT 'Time the step left RUNNING',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_steps_path (namespace_id, instance_id, step_path),
  KEY ix_weave_steps_history (namespace_id, instance_id, seq),
  CONSTRAINT ck_weave_steps_type CHECK (step_type IN ('task', 'wait_signal', 'sleep', 'poll', 'parallel', 'join', 'choice', 'succeed', 'fail')),
  CONSTRAINT ck_weave_steps_state CHECK (state IN ('RUNNING', 'SUCCEEDED', 'TIMED_OUT', 'FAILED', 'CANCELLED')),
  CONSTRAINT ck_weave_steps_finished CHECK ((state = 'RUNNING') = (finished_at IS NULL)),
  CONSTRAINT ck_weave_steps_output_json CHECK (output IS NULL OR JSON_VALID(output)),
  CONSTRAINT ck_weave_steps_error_json CHECK (error IS NULL OR JSON_VALID(error)),
  CONSTRAINT ck_weave_steps_path CHECK (CHAR_LENGTH(step_path) >= 1),
  CONSTRAINT ck_weave_steps_seq CHECK (seq >= 1),
  CONSTRAINT ck_weave_steps_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Per instance, per step state (each step runs at most once per instance)';

CREATE TABLE weave_activations (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Activation id',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  step_path VARCHAR(255) NOT NULL COMMENT 'Step the activation belongs to',
  activation_no INT UNSIGNED NOT NULL COMMENT '1, 2, ... per (instance, step) (the poll round number for poll rounds)',
  kind VARCHAR(16) NOT NULL COMMENT 'task (one task run), poll_round (one poll round task), timer (a sleep) or signal (a signal wait)',
  task_id BINARY(16) NULL COMMENT 'pulse_tasks.id of the task run, created in the same transaction (task and poll_round only)',
  state VARCHAR(16) NOT NULL COMMENT 'RUNNING, SUCCEEDED, FAILED, CANCELLED or TIMED_OUT',
  result MEDIUMTEXT NULL COMMENT 'Result JSON text (task result or signal payload)',
  error JSON NULL COMMENT 'Error object of a failed task run or timeout',
  condition_met TINYINT(1) NULL COMMENT 'poll_round only: 1 when the until condition held on the result, 0 when not, NULL before evaluation',
  seq BIGINT UNSIGNED NOT NULL COMMENT 'History position (weave_instances.history_seq)',
  started_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  finished_at DATETIME(6) NULL COMMENT 'Time it left RUNNING',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_activations_number (namespace_id, instance_id, step_path, activation_no),
  UNIQUE KEY uq_weave_activations_task (namespace_id, task_id),
  KEY ix_weave_activations_history (namespace_id, instance_id, seq),
  CONSTRAINT ck_weave_activations_kind CHECK (kind IN ('task', 'poll_round', 'timer', 'signal')),
  CONSTRAINT ck_weave_activations_state CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT')),
  CONSTRAINT ck_weave_activations_finished CHECK ((state = 'RUNNING') = (finished_at IS NULL)),
  CONSTRAINT ck_weave_activations_task_link CHECK ((kind IN ('task', 'poll_round')) = (task_id IS NOT NULL)),
  CONSTRAINT ck_weave_activations_condition CHECK (condition_met IS NULL OR (kind = 'poll_round' AND condition_met IN (0, 1))),
  CONSTRAINT ck_weave_activations_result_json CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_weave_activations_error_json CHECK (error IS NULL OR JSON_VALID(error)),
  CONSTRAINT ck_weave_activations_number CHECK (activation_no >= 1 AND seq >= 1),
  CONSTRAINT ck_weave_activations_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Activations: each task run, poll round, timer and signal wait of a step, linked to its Pulse task';

CREATE TABLE weave_waits (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Wait id (also the source_event_id of its timer_fired inbox event)',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  step_path VARCHAR(255) NOT NULL COMMENT 'Step that waits',
  activation_id BINARY(16) NULL COMMENT 'weave_activations.id the wait belongs to, NULL for poll interval and deadline timers',
  kind VARCHAR(16) NOT NULL COMMENT 'signal (with optional timeout at due_at), sleep, poll_interval or poll_deadline',
  signal_name VARCHAR(63) NULL COMMENT 'Signal name waited for (signal waits only)',
  correlation_key VARCHAR(255) NULL COMMENT 'Correlation key the signal must carry, NULL = any (signal waits only)',
  due_at DATETIME(6) NULL COMMENT 'Timer due time (database clock), the timeout of a signal wait, NULL = no timeout',
  state VARCHAR(16) NOT NULL COMMENT 'OPEN, MATCHED (a signal satisfied it), FIRED (the timer or timeout fired) or CANCELLED',
  signal_row_id BINARY(16) NULL COMMENT 'weave_signals.id of the matching signal when MATCHED',
  notified_at DATETIME(6) NULL COMMENT 'Time the timer loop wrote the timer_fired inbox event, NULL before',
  seq BIGINT UNSIGNED NOT NULL COMMENT 'History position (weave_instances.history_seq)',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  resolved_at DATETIME(6) NULL COMMENT 'Time it left OPEN',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  KEY ix_weave_waits_due (state, notified_at, due_at),
  KEY ix_weave_waits_signal (namespace_id, instance_id, state, signal_name),
  KEY ix_weave_waits_history (namespace_id, instance_id, seq),
  CONSTRAINT ck_weave_waits_kind CHECK (kind IN ('signal', 'sleep', 'poll_interval', 'poll_deadline')),
  CONSTRAINT ck_weave_waits_state CHECK (state IN ('OPEN', 'MATCHED', 'FIRED', 'CANCELLED')),
  CONSTRAINT ck_weave_waits_signal_name CHECK ((kind = 'signal') = (signal_name IS NOT NULL)),
  CONSTRAINT ck_weave_waits_signal_name_rule CHECK (signal_name IS NULL OR signal_name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_weave_waits_correlation CHECK (correlation_key IS NULL OR kind = 'signal'),
  CONSTRAINT ck_weave_waits_timer_due CHECK (kind = 'signal' OR due_at IS NOT NULL),
  CONSTRAINT ck_weave_waits_matched CHECK ((state = 'MATCHED') = (signal_row_id IS NOT NULL)),
  CONSTRAINT ck_weave_waits_matched_kind CHECK (state <> 'MATCHED' OR kind = 'signal'),
  CONSTRAINT ck_weave_waits_fired_due CHECK (state <> 'FIRED' OR due_at IS NOT NULL),
  CONSTRAINT ck_weave_waits_resolved CHECK ((state = 'OPEN') = (resolved_at IS NULL)),
  CONSTRAINT ck_weave_waits_seq CHECK (seq >= 1),
  CONSTRAINT ck_weave_waits_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Signal waits and durable timers (sleeps, signal timeouts, poll intervals and deadlines)';

CREATE TABLE weave_signals (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Signal row id (also the source_event_id of its signal_arrived inbox event)',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id the signal was sent to',
  signal_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'Client-chosen signal id (1-128 printable ASCII), de-duplicated per instance',
  name VARCHAR(63) NOT NULL COMMENT 'Signal name (API.md names rule)',
  correlation_key VARCHAR(255) NULL COMMENT 'Correlation key sent with the signal, NULL when none',
  payload MEDIUMTEXT NOT NULL COMMENT 'Payload JSON text exactly as sent',
  request_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the canonical signal (name, correlation key, payload) to tell a replay from a conflicting reuse',
  matched_wait_id BINARY(16) NULL COMMENT 'weave_waits.id that consumed it, NULL while it waits for its wait (kept when it arrives first)',
  matched_at DATETIME(6) NULL COMMENT 'Time it was matched',
  sent_by BINARY(16) NULL COMMENT 'Credential that sent it, NULL when none',
  received_at DATETIME(6) NOT NULL COMMENT 'Arrival time (UTC), the matching order for early signals',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped when matched',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_signals_signal_id (namespace_id, instance_id, signal_id),
  KEY ix_weave_signals_unmatched (namespace_id, instance_id, name, matched_at, received_at),
  CONSTRAINT ck_weave_signals_name CHECK (name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_weave_signals_signal_id CHECK (CHAR_LENGTH(signal_id) BETWEEN 1 AND 128),
  CONSTRAINT ck_weave_signals_payload_json CHECK (JSON_VALID(payload)),
  CONSTRAINT ck_weave_signals_matched CHECK ((matched_wait_id IS NULL) = (matched_at IS NULL)),
  CONSTRAINT ck_weave_signals_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Signals sent to instances, de-duplicated by signal id. An early signal is kept until a wait matches it';

CREATE TABLE weave_poll_states (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Poll state id',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  step_path VARCHAR(255) NOT NULL COMMENT 'The poll step',
  state VARCHAR(16) NOT NULL COMMENT 'ACTIVE, SATISFIED (condition held), EXHAUSTED (rounds, deadline or a failed round) or CANCELLED',
  rounds_started INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Rounds whose task was created',
  rounds_completed INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Rounds whose outcome was evaluated',
  max_rounds INT UNSIGNED NOT NULL COMMENT 'Round budget frozen from the definition',
  max_attempts INT UNSIGNED NOT NULL COMMENT 'Per-round attempt budget (the round task max_attempts)',
  interval_ms BIGINT UNSIGNED NOT NULL COMMENT 'Delay between the end of a round and the start of the next',
  deadline_at DATETIME(6) NULL COMMENT 'No new round starts at or after this time, NULL = none',
  next_round_at DATETIME(6) NULL COMMENT 'Due time of the next round while waiting for the interval',
  current_activation_id BINARY(16) NULL COMMENT 'Activation of the round in progress, NULL between rounds',
  last_result MEDIUMTEXT NULL COMMENT 'Result JSON text of the last evaluated round',
  exhausted_reason VARCHAR(16) NULL COMMENT 'max_rounds, deadline or round_failed when EXHAUSTED',
  started_at DATETIME(6) NOT NULL COMMENT 'Time the poll step started',
  finished_at DATETIME(6) NULL COMMENT 'Time it left ACTIVE',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_poll_states_step (namespace_id, instance_id, step_path),
  CONSTRAINT ck_weave_poll_states_state CHECK (state IN ('ACTIVE', 'SATISFIED', 'EXHAUSTED', 'CANCELLED')),
  CONSTRAINT ck_weave_poll_states_budget CHECK (max_rounds >= 1 AND max_attempts >= 1),
  CONSTRAINT ck_weave_poll_states_rounds CHECK (rounds_completed <= rounds_started AND rounds_started <= max_rounds),
  CONSTRAINT ck_weave_poll_states_finished CHECK ((state = 'ACTIVE') = (finished_at IS NULL)),
  CONSTRAINT ck_weave_poll_states_exhausted CHECK ((state = 'EXHAUSTED') = (exhausted_reason IS NOT NULL)),
  CONSTRAINT ck_weave_poll_states_reason CHECK (exhausted_reason IS NULL OR exhausted_reason IN ('max_rounds', 'deadline', 'round_failed')),
  CONSTRAINT ck_weave_poll_states_result_json CHECK (last_result IS NULL OR JSON_VALID(last_result)),
  CONSTRAINT ck_weave_poll_states_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Progress of a running poll step: rounds against their budget and deadline';

CREATE TABLE weave_poll_rounds (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Round record id',
  poll_state_id BINARY(16) NOT NULL COMMENT 'weave_poll_states.id',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  step_path VARCHAR(255) NOT NULL COMMENT 'The poll step',
  round_no INT UNSIGNED NOT NULL COMMENT 'Round number, 1, 2, ... (equals the activation_no of its activation)',
  activation_id BINARY(16) NOT NULL COMMENT 'weave_activations.id of the round',
  task_id BINARY(16) NOT NULL COMMENT 'pulse_tasks.id of the round task',
  outcome VARCHAR(16) NOT NULL COMMENT 'met (condition held), not_met, or failed (task failed or the condition could not be evaluated)',
  result MEDIUMTEXT NULL COMMENT 'Round task result JSON text, NULL when the task failed',
  error JSON NULL COMMENT 'Why the round failed',
  evaluated_at DATETIME(6) NOT NULL COMMENT 'Time the outcome was recorded',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_poll_rounds_round (namespace_id, poll_state_id, round_no),
  KEY ix_weave_poll_rounds_instance (namespace_id, instance_id, step_path, round_no),
  CONSTRAINT ck_weave_poll_rounds_outcome CHECK (outcome IN ('met', 'not_met', 'failed')),
  CONSTRAINT ck_weave_poll_rounds_failed_error CHECK ((outcome = 'failed') = (error IS NOT NULL)),
  CONSTRAINT ck_weave_poll_rounds_result_json CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_weave_poll_rounds_error_json CHECK (error IS NULL OR JSON_VALID(error)),
  CONSTRAINT ck_weave_poll_rounds_round CHECK (round_no >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Immutable record of each evaluated poll round, written once when its outcome is known';

CREATE TRIGGER trg_weave_poll_rounds_no_update BEFORE UPDATE ON weave_poll_rounds
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_poll_rounds is immutable';

CREATE TRIGGER trg_weave_poll_rounds_no_delete BEFORE DELETE ON weave_poll_rounds
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_poll_rounds is immutable';

CREATE TABLE weave_inbox (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Inbox event id',
  instance_id BINARY(16) NOT NULL COMMENT 'Instance the event advances',
  kind VARCHAR(16) NOT NULL COMMENT 'task_finished, timer_fired or signal_arrived',
  source_event_id BINARY(16) NOT NULL COMMENT 'De-duplication key: the task id (task_finished), wait id (timer_fired) or signal row id (signal_arrived)',
  step_path VARCHAR(255) NULL COMMENT 'Step the event is for, when known',
  payload MEDIUMTEXT NULL COMMENT 'Business JSON text carried by the event (task result, signal payload), NULL when none',
  data JSON NULL COMMENT 'Platform metadata (task state, error, activation id)',
  available_at DATETIME(6) NOT NULL COMMENT 'Not processed before this time (backoff after a failed advance)',
  attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Advance attempts that failed on this event',
  last_error JSON NULL COMMENT 'Error of the last failed advance attempt',
  processed_at DATETIME(6) NULL COMMENT 'Time the advance that consumed it committed, NULL while pending',
  outcome VARCHAR(16) NULL COMMENT 'applied, ignored (stale or for a finished instance) or deferred (recorded as a pending advance)',
  created_at DATETIME(6) NOT NULL COMMENT 'Time the event was written (UTC)',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_inbox_source (namespace_id, source_event_id),
  KEY ix_weave_inbox_pending (processed_at, available_at),
  KEY ix_weave_inbox_instance (namespace_id, instance_id, processed_at, created_at),
  CONSTRAINT ck_weave_inbox_kind CHECK (kind IN ('task_finished', 'timer_fired', 'signal_arrived')),
  CONSTRAINT ck_weave_inbox_outcome CHECK (outcome IS NULL OR outcome IN ('applied', 'ignored', 'deferred')),
  CONSTRAINT ck_weave_inbox_processed CHECK ((processed_at IS NULL) = (outcome IS NULL)),
  CONSTRAINT ck_weave_inbox_payload_json CHECK (payload IS NULL OR JSON_VALID(payload)),
  CONSTRAINT ck_weave_inbox_data_json CHECK (data IS NULL OR JSON_VALID(data)),
  CONSTRAINT ck_weave_inbox_last_error_json CHECK (last_error IS NULL OR JSON_VALID(last_error)),
  CONSTRAINT ck_weave_inbox_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Internal events that advance instances, de-duplicated by source event id and consumed by the advancer';

CREATE TABLE weave_pending_advances (
  namespace_id BINARY(16) NOT NULL COMMENT 'Owning namespace',
  id BINARY(16) NOT NULL COMMENT 'Pending advance id',
  instance_id BINARY(16) NOT NULL COMMENT 'weave_instances.id',
  inbox_id BINARY(16) NULL COMMENT 'weave_inbox.id whose effect was deferred, NULL for a batch continuation',
  reason VARCHAR(16) NOT NULL COMMENT 'paused (recorded while the instance was paused) or batch (the rest of an advance cut into batches)',
  checkpoint JSON NULL COMMENT 'Engine resume state (for example the branches still to activate)',
  control_revision BIGINT UNSIGNED NOT NULL COMMENT 'Instance control_revision when recorded',
  state VARCHAR(16) NOT NULL COMMENT 'PENDING, DONE (resumed and applied) or DISCARDED (instance ended first)',
  created_at DATETIME(6) NOT NULL COMMENT 'Time recorded (UTC), the resume order',
  resolved_at DATETIME(6) NULL COMMENT 'Time it left PENDING',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  KEY ix_weave_pending_advances_instance (namespace_id, instance_id, state, created_at),
  KEY ix_weave_pending_advances_due (state, reason, created_at),
  CONSTRAINT ck_weave_pending_advances_reason CHECK (reason IN ('paused', 'batch')),
  CONSTRAINT ck_weave_pending_advances_state CHECK (state IN ('PENDING', 'DONE', 'DISCARDED')),
  CONSTRAINT ck_weave_pending_advances_resolved CHECK ((state = 'PENDING') = (resolved_at IS NULL)),
  CONSTRAINT ck_weave_pending_advances_paused_inbox CHECK (reason <> 'paused' OR inbox_id IS NOT NULL),
  CONSTRAINT ck_weave_pending_advances_checkpoint_json CHECK (checkpoint IS NULL OR JSON_VALID(checkpoint)),
  CONSTRAINT ck_weave_pending_advances_revision CHECK (revision >= 1 AND control_revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Checkpoints of advances deferred while paused or cut into batches, resumed later in created_at order'
