-- Pulse: queues, execution gates, worker instances and sessions, tasks, attempts, receipts,
-- evidence, side-effect ledger, concurrency limits and permits, schedules.
-- Rules: docs/architecture.md (no foreign keys, named CHECKs, PK (namespace_id, id)).

CREATE TABLE pulse_queues (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace (orbit_namespaces.id)',
  id BINARY(16) NOT NULL COMMENT 'random 128-bit queue id',
  name VARCHAR(63) NOT NULL COMMENT 'queue name, unique per namespace, case-sensitive',
  max_unfinished_tasks BIGINT UNSIGNED NULL COMMENT 'submit limit on non-terminal tasks; NULL = unlimited',
  max_concurrency INT UNSIGNED NULL COMMENT 'queue permits: max RUNNING attempts; NULL = unlimited',
  max_starts_per_second INT UNSIGNED NULL COMMENT 'starts allowed per one-second window; NULL = unlimited',
  lease_ms INT UNSIGNED NOT NULL DEFAULT 30000 COMMENT 'lease granted to an offer or running attempt, extended by heartbeats',
  retry_max_attempts INT UNSIGNED NOT NULL DEFAULT 3 COMMENT 'default max attempts for tasks that do not set one',
  retry_backoff_initial_ms INT UNSIGNED NOT NULL DEFAULT 1000 COMMENT 'first retry delay',
  retry_backoff_max_ms INT UNSIGNED NOT NULL DEFAULT 300000 COMMENT 'retry delay cap',
  retry_backoff_multiplier DOUBLE NOT NULL DEFAULT 2 COMMENT 'delay growth per attempt',
  stuck_after_ms BIGINT UNSIGNED NULL COMMENT 'watchdog bound on time in a non-terminal state; NULL = off',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'config revision (ETag); usage never bumps it',
  created_at DATETIME(6) NOT NULL COMMENT 'creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'last config change (UTC)',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_queues_name (namespace_id, name),
  CONSTRAINT ck_pulse_queues_lease CHECK (lease_ms >= 1000),
  CONSTRAINT ck_pulse_queues_attempts CHECK (retry_max_attempts >= 1),
  CONSTRAINT ck_pulse_queues_multiplier CHECK (retry_backoff_multiplier >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Pulse queues: configuration only (live usage is in pulse_queue_usage)';

CREATE TABLE pulse_queue_usage (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  queue_id BINARY(16) NOT NULL COMMENT 'the queue (pulse_queues.id)',
  unfinished_tasks BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'tasks in WAITING, LEASED, RUNNING or NEEDS_REVIEW',
  reservations BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'offered (LEASED) attempts not yet started',
  active_attempts BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'RUNNING attempts (queue permits held)',
  window_start DATETIME(6) NULL COMMENT 'start of the current one-second start-rate window',
  window_starts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'starts granted in the current window',
  denials_quota BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'submits refused by max_unfinished_tasks',
  denials_permits BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'starts refused by max_concurrency',
  denials_rate BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'starts refused by the start-rate window',
  PRIMARY KEY (namespace_id, queue_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Live queue counters, changed in the same transaction as the task or attempt change';

CREATE TABLE pulse_execution_gates (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'random gate id',
  queue_id BINARY(16) NOT NULL COMMENT 'queue of a queue gate; 16 zero bytes for the namespace gate',
  paused TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = closed: no new starts (running attempts continue)',
  control_revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'bumped on every pause or resume',
  updated_at DATETIME(6) NOT NULL COMMENT 'last pause or resume',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_execution_gates_scope (namespace_id, queue_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Pause/resume gates at namespace or queue scope';

CREATE TABLE pulse_worker_instances (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'instance id (client-chosen 32 hex or random)',
  application_id BINARY(16) NOT NULL COMMENT 'application of the credential that registered it',
  host VARCHAR(255) NOT NULL COMMENT 'host name reported by the worker',
  pid INT UNSIGNED NOT NULL COMMENT 'process id reported by the worker',
  sdk VARCHAR(64) NOT NULL COMMENT 'SDK name and version',
  created_at DATETIME(6) NOT NULL COMMENT 'first registration',
  last_seen_at DATETIME(6) NOT NULL COMMENT 'last session registration or heartbeat',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Worker processes';

CREATE TABLE pulse_worker_sessions (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'session id',
  instance_id BINARY(16) NOT NULL COMMENT 'pulse_worker_instances.id',
  application_id BINARY(16) NOT NULL COMMENT 'application of the credential that opened the session',
  credential_id BINARY(16) NOT NULL COMMENT 'credential that opened the session',
  token_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the session token (the token is shown once)',
  queues JSON NOT NULL COMMENT 'queue names this session takes work from',
  max_concurrency INT UNSIGNED NOT NULL COMMENT 'max offered + running attempts at once',
  concurrency_keys TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = the worker handles keyed tasks (fencing tokens)',
  state ENUM('ACTIVE','CLOSED','EXPIRED') NOT NULL DEFAULT 'ACTIVE' COMMENT 'ACTIVE until closed by the worker or expired by recovery',
  node_id VARCHAR(64) NULL COMMENT 'server node holding the WebSocket stream, if connected',
  heartbeat_ms INT UNSIGNED NOT NULL COMMENT 'expected heartbeat interval',
  lease_ms INT UNSIGNED NOT NULL COMMENT 'session lease: expires this long after the last heartbeat',
  expires_at DATETIME(6) NOT NULL COMMENT 'database time after which the session is expired',
  created_at DATETIME(6) NOT NULL COMMENT 'registration time',
  closed_at DATETIME(6) NULL COMMENT 'time of CLOSED or EXPIRED',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  KEY ix_pulse_worker_sessions_expiry (state, expires_at),
  CONSTRAINT ck_pulse_worker_sessions_closed CHECK (state = 'ACTIVE' OR closed_at IS NOT NULL),
  CONSTRAINT ck_pulse_worker_sessions_concurrency CHECK (max_concurrency >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Worker connections: capabilities, token digest, heartbeat expiry';

CREATE TABLE pulse_tasks (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'task id',
  owner_id BINARY(16) NOT NULL COMMENT 'the application that owns (submitted, pays for) the task',
  queue_id BINARY(16) NOT NULL COMMENT 'pulse_queues.id',
  queue_name VARCHAR(63) NOT NULL COMMENT 'queue name, kept for snapshots and filters',
  kind VARCHAR(255) NOT NULL COMMENT 'task kind (handler selector)',
  pipeline_version VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'version of the producing pipeline; part of the identity',
  dedup_key VARCHAR(255) NULL COMMENT 'identity key; NULL = no de-duplication',
  payload MEDIUMTEXT NOT NULL COMMENT 'business JSON exactly as submitted',
  priority TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT '0 (low) to 9 (high)',
  available_at DATETIME(6) NOT NULL COMMENT 'not dispatched before this time',
  dispatch_at DATETIME(6) AS (available_at - INTERVAL (priority * 30) SECOND) STORED COMMENT 'dispatch order: available_at minus 30 s per priority step',
  deadline_at DATETIME(6) NULL COMMENT 'not started after this time; ends FAILED',
  max_attempts INT UNSIGNED NOT NULL COMMENT 'frozen at submit',
  retry_backoff_initial_ms INT UNSIGNED NOT NULL COMMENT 'frozen at submit',
  retry_backoff_max_ms INT UNSIGNED NOT NULL COMMENT 'frozen at submit',
  retry_backoff_multiplier DOUBLE NOT NULL COMMENT 'frozen at submit',
  retry_safe TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = idempotent: a lost running attempt is retried instead of reviewed',
  concurrency_key VARCHAR(255) NULL COMMENT 'keyed concurrency: one running attempt per key',
  concurrency_key_digest BINARY(32) NULL COMMENT 'SHA-256 of the exact UTF-8 bytes of concurrency_key',
  state ENUM('WAITING','LEASED','RUNNING','SUCCEEDED','FAILED','CANCELLED','NEEDS_REVIEW') NOT NULL DEFAULT 'WAITING' COMMENT 'task state',
  state_version INT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'incremented on every state change (consumers keep the highest)',
  attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'attempts made so far (generation of the latest)',
  current_attempt_id BINARY(16) NULL COMMENT 'attempt holding the task while LEASED or RUNNING',
  session_id BINARY(16) NULL COMMENT 'session of the current attempt',
  lease_expires_at DATETIME(6) NULL COMMENT 'lease of the current attempt (database time)',
  cancel_requested TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = cancel pushed to the running worker',
  effect_uncertain TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = a running attempt was lost: its effect may or may not have happened',
  result MEDIUMTEXT NULL COMMENT 'business JSON result of SUCCEEDED',
  error JSON NULL COMMENT 'error object of FAILED/NEEDS_REVIEW/CANCELLED',
  resolution JSON NULL COMMENT 'operator resolution of NEEDS_REVIEW (action, note, who, when)',
  source_kind ENUM('api','schedule','workflow') NOT NULL DEFAULT 'api' COMMENT 'what created the task',
  source_id BINARY(16) NULL COMMENT 'schedule occurrence or workflow activation id',
  stuck_at DATETIME(6) NULL COMMENT 'when the watchdog surfaced the task as stuck in this state',
  stuck_reason VARCHAR(255) NULL COMMENT 'why the watchdog surfaced it',
  created_at DATETIME(6) NOT NULL COMMENT 'submit time',
  state_changed_at DATETIME(6) NOT NULL COMMENT 'last state change (watchdog clock)',
  started_at DATETIME(6) NULL COMMENT 'start of the latest attempt',
  finished_at DATETIME(6) NULL COMMENT 'time of the terminal state',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped on every change',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_tasks_identity (namespace_id, owner_id, kind, pipeline_version, dedup_key),
  KEY ix_pulse_tasks_dispatch (namespace_id, queue_id, state, dispatch_at, id),
  KEY ix_pulse_tasks_owner (namespace_id, owner_id, state, queue_id),
  KEY ix_pulse_tasks_state_age (namespace_id, state, state_changed_at),
  KEY ix_pulse_tasks_created (namespace_id, created_at, id),
  KEY ix_pulse_tasks_lease (state, lease_expires_at),
  KEY ix_pulse_tasks_deadline (state, deadline_at),
  CONSTRAINT ck_pulse_tasks_priority CHECK (priority BETWEEN 0 AND 9),
  CONSTRAINT ck_pulse_tasks_payload_json CHECK (JSON_VALID(payload)),
  CONSTRAINT ck_pulse_tasks_result_json CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_pulse_tasks_terminal_finished CHECK (state NOT IN ('SUCCEEDED','FAILED','CANCELLED') OR finished_at IS NOT NULL),
  CONSTRAINT ck_pulse_tasks_waiting_no_lease CHECK (state <> 'WAITING' OR (current_attempt_id IS NULL AND lease_expires_at IS NULL)),
  CONSTRAINT ck_pulse_tasks_held_has_lease CHECK (state NOT IN ('LEASED','RUNNING') OR (current_attempt_id IS NOT NULL AND lease_expires_at IS NOT NULL)),
  CONSTRAINT ck_pulse_tasks_uncertain CHECK (effect_uncertain = 0 OR state NOT IN ('SUCCEEDED','FAILED','CANCELLED')),
  CONSTRAINT ck_pulse_tasks_max_attempts CHECK (max_attempts >= 1),
  CONSTRAINT ck_pulse_tasks_key_digest CHECK ((concurrency_key IS NULL) = (concurrency_key_digest IS NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Tasks: one owner each; identity (owner, kind, pipeline_version, dedup_key) unique per namespace';

CREATE TABLE pulse_attempts (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'attempt id',
  task_id BINARY(16) NOT NULL COMMENT 'pulse_tasks.id',
  generation INT UNSIGNED NOT NULL COMMENT 'execution generation: 1 for the first attempt of the task, +1 each',
  session_id BINARY(16) NOT NULL COMMENT 'worker session the attempt is bound to',
  state ENUM('OFFERED','RUNNING','SUCCEEDED','FAILED','CANCELLED','LOST','RELEASED') NOT NULL DEFAULT 'OFFERED' COMMENT 'OFFERED (leased, not started), RUNNING, finished states, LOST (running lease lost), RELEASED (offer expired, denied or given back)',
  execution_token_digest BINARY(32) NULL COMMENT 'SHA-256 of the execution (fencing) token, set at start',
  concurrency_token BIGINT UNSIGNED NULL COMMENT 'revision of the concurrency key granted at start (fencing for outside writes)',
  lease_expires_at DATETIME(6) NOT NULL COMMENT 'offer or running lease (database time)',
  offered_at DATETIME(6) NOT NULL COMMENT 'time of the offer',
  started_at DATETIME(6) NULL COMMENT 'time of the authorised start',
  finished_at DATETIME(6) NULL COMMENT 'time the attempt ended',
  result MEDIUMTEXT NULL COMMENT 'business JSON result reported by complete',
  error JSON NULL COMMENT 'error reported by fail, or the reason of LOST/RELEASED',
  retryable TINYINT(1) NULL COMMENT 'set only on an explicit failure: the worker said it may be retried',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  started_generation INT UNSIGNED AS (IF(started_at IS NULL, NULL, generation)) STORED COMMENT 'generation once started (NULL for offers never started): an offer released unstarted does not use up its generation',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_attempts_generation (namespace_id, task_id, started_generation),
  KEY ix_pulse_attempts_task (namespace_id, task_id, generation),
  KEY ix_pulse_attempts_session (namespace_id, session_id, state),
  KEY ix_pulse_attempts_lease (state, lease_expires_at),
  CONSTRAINT ck_pulse_attempts_retryable CHECK (retryable IS NULL OR state = 'FAILED'),
  CONSTRAINT ck_pulse_attempts_running_token CHECK (state <> 'RUNNING' OR execution_token_digest IS NOT NULL),
  CONSTRAINT ck_pulse_attempts_finished CHECK (state IN ('OFFERED','RUNNING') OR finished_at IS NOT NULL),
  CONSTRAINT ck_pulse_attempts_result_json CHECK (result IS NULL OR JSON_VALID(result))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='One execution generation of a task, bound to one session';

CREATE TABLE pulse_attempt_receipts (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'receipt id (receipt_id on the wire)',
  attempt_id BINARY(16) NOT NULL COMMENT 'pulse_attempts.id',
  operation ENUM('complete','fail','cancelled') NOT NULL COMMENT 'reported operation',
  request_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the canonical report (without msg_id)',
  task_state VARCHAR(16) NOT NULL COMMENT 'task state after the report was applied',
  created_at DATETIME(6) NOT NULL COMMENT 'time the report was applied',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_attempt_receipts_report (namespace_id, attempt_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='The one applied result report of an attempt; an identical re-sent report gets it back';

CREATE TABLE pulse_attempt_evidence (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'evidence id',
  attempt_id BINARY(16) NOT NULL COMMENT 'attempt the fact is about',
  task_id BINARY(16) NOT NULL COMMENT 'task of the attempt',
  kind VARCHAR(32) NOT NULL COMMENT 'late_complete, late_fail, late_cancelled, lost, operator_resolution',
  result MEDIUMTEXT NULL COMMENT 'business JSON result carried by a late report',
  data JSON NULL COMMENT 'other facts (error, reason, note, reporter)',
  created_at DATETIME(6) NOT NULL COMMENT 'time recorded',
  PRIMARY KEY (namespace_id, id),
  KEY ix_pulse_attempt_evidence_task (namespace_id, task_id, created_at),
  CONSTRAINT ck_pulse_attempt_evidence_result_json CHECK (result IS NULL OR JSON_VALID(result))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Late or out-of-band facts about attempts: recorded, never applied to a newer attempt';

CREATE TRIGGER trg_pulse_attempt_evidence_no_update BEFORE UPDATE ON pulse_attempt_evidence
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_attempt_evidence is immutable';

CREATE TRIGGER trg_pulse_attempt_evidence_no_delete BEFORE DELETE ON pulse_attempt_evidence
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_attempt_evidence is immutable';

CREATE TABLE pulse_effects (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'effect id',
  task_id BINARY(16) NOT NULL COMMENT 'task whose handler declared the effect (stable across retries)',
  effect_key VARCHAR(255) NOT NULL COMMENT 'key given by the handler',
  key_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of effect_key',
  state ENUM('BEGUN','COMMITTED') NOT NULL COMMENT 'BEGUN by an attempt; COMMITTED with its result',
  attempt_id BINARY(16) NOT NULL COMMENT 'attempt that last began or committed the effect',
  generation INT UNSIGNED NOT NULL COMMENT 'generation of that attempt',
  result MEDIUMTEXT NULL COMMENT 'business JSON result stored at commit',
  begun_at DATETIME(6) NOT NULL COMMENT 'time of begin',
  committed_at DATETIME(6) NULL COMMENT 'time of commit',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_effects_key (namespace_id, task_id, key_digest),
  CONSTRAINT ck_pulse_effects_committed CHECK (state <> 'COMMITTED' OR committed_at IS NOT NULL),
  CONSTRAINT ck_pulse_effects_result_json CHECK (result IS NULL OR JSON_VALID(result))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Side-effect ledger: exactly-once barrier for handler effects across retries';

CREATE TABLE pulse_concurrency_limits (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'limit id',
  key_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the exact UTF-8 bytes of the concurrency key',
  concurrency_key VARCHAR(255) NOT NULL COMMENT 'the key as given',
  max_permits INT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'permits for this key (1: one running attempt per key)',
  held INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'permits currently held',
  grant_revision BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'incremented on every grant; the value is the fencing token; never reused',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision',
  updated_at DATETIME(6) NOT NULL COMMENT 'last grant or release',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_concurrency_limits_key (namespace_id, key_digest),
  CONSTRAINT ck_pulse_concurrency_limits_held CHECK (held <= max_permits),
  CONSTRAINT ck_pulse_concurrency_limits_nowrap CHECK (grant_revision < 18446744073709551615)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Per-key concurrency limits and their monotonic fencing revision';

CREATE TABLE pulse_permits (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'permit id',
  attempt_id BINARY(16) NOT NULL COMMENT 'attempt holding the permit',
  kind ENUM('queue','key') NOT NULL COMMENT 'queue permit or concurrency-key permit',
  holder_ref BINARY(16) NOT NULL COMMENT 'queue id or pulse_concurrency_limits.id',
  token BIGINT UNSIGNED NULL COMMENT 'fencing token of a key permit (grant_revision at grant)',
  granted_at DATETIME(6) NOT NULL COMMENT 'time of grant',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_permits_attempt (namespace_id, attempt_id, kind)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Permits held by running attempts; deleted with the attempt end in the same transaction';

CREATE TABLE pulse_schedules (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'schedule id',
  name VARCHAR(63) NOT NULL COMMENT 'schedule name, unique per namespace',
  owner_id BINARY(16) NOT NULL COMMENT 'application that owns the schedule and its tasks',
  current_version INT UNSIGNED NOT NULL COMMENT 'version used for fire times from now on',
  paused TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = paused: no occurrences fire',
  control_revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'bumped on pause and resume',
  check_at DATETIME(6) NULL COMMENT 'next time the scheduler must look (next fire time); NULL = nothing left',
  covered_until DATETIME(6) NOT NULL COMMENT 'every fire time before this (exclusive) has been handled',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision (ETag)',
  created_at DATETIME(6) NOT NULL COMMENT 'creation time',
  updated_at DATETIME(6) NOT NULL COMMENT 'last change',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_schedules_name (namespace_id, name),
  KEY ix_pulse_schedules_due (paused, check_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Schedules and their progress';

CREATE TABLE pulse_schedule_versions (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'version row id',
  schedule_id BINARY(16) NOT NULL COMMENT 'pulse_schedules.id',
  version INT UNSIGNED NOT NULL COMMENT '1, 2, ... per schedule',
  queue_name VARCHAR(63) NOT NULL COMMENT 'queue the tasks go to',
  cron VARCHAR(255) NULL COMMENT 'cron expression (5 or 6 fields), or NULL for every_ms',
  every_ms BIGINT UNSIGNED NULL COMMENT 'fixed interval, or NULL for cron',
  timezone VARCHAR(64) NOT NULL DEFAULT 'UTC' COMMENT 'IANA time zone of the cron expression',
  tzdata_version VARCHAR(32) NOT NULL COMMENT 'tzdata release frozen into the version',
  task_kind VARCHAR(255) NOT NULL COMMENT 'kind of the created tasks',
  task_payload MEDIUMTEXT NOT NULL COMMENT 'business JSON payload of the created tasks',
  task_priority TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'priority of the created tasks',
  task_pipeline_version VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'pipeline_version of the created tasks',
  task_options JSON NULL COMMENT 'other template fields (dedup rule, max_attempts, retry_safe, deadline)',
  catchup_window_ms BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'missed occurrences younger than this still fire',
  grace_ms BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'lateness tolerated before an occurrence counts as late',
  start_at DATETIME(6) NULL COMMENT 'no fire times before this',
  end_at DATETIME(6) NULL COMMENT 'no fire times at or after this',
  created_at DATETIME(6) NOT NULL COMMENT 'publish time',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_schedule_versions_version (namespace_id, schedule_id, version),
  CONSTRAINT ck_pulse_schedule_versions_spec CHECK ((cron IS NULL) <> (every_ms IS NULL)),
  CONSTRAINT ck_pulse_schedule_versions_every CHECK (every_ms IS NULL OR every_ms >= 1000),
  CONSTRAINT ck_pulse_schedule_versions_payload_json CHECK (JSON_VALID(task_payload)),
  CONSTRAINT ck_pulse_schedule_versions_priority CHECK (task_priority BETWEEN 0 AND 9)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Immutable schedule versions';

CREATE TRIGGER trg_pulse_schedule_versions_no_update BEFORE UPDATE ON pulse_schedule_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_versions is immutable';

CREATE TRIGGER trg_pulse_schedule_versions_no_delete BEFORE DELETE ON pulse_schedule_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_versions is immutable';

CREATE TABLE pulse_schedule_occurrences (
  namespace_id BINARY(16) NOT NULL COMMENT 'owning namespace',
  id BINARY(16) NOT NULL COMMENT 'occurrence id',
  schedule_id BINARY(16) NOT NULL COMMENT 'pulse_schedules.id',
  fire_at DATETIME(6) NOT NULL COMMENT 'UTC fire time; unique per schedule',
  fire_at_local VARCHAR(40) NOT NULL COMMENT 'fire time in the schedule time zone, ISO 8601 with offset',
  version INT UNSIGNED NOT NULL COMMENT 'schedule version that produced it',
  task_id BINARY(16) NULL COMMENT 'task created for it (NULL when skipped)',
  outcome ENUM('created','skipped') NOT NULL COMMENT 'created a task, or skipped (outside catch-up)',
  late TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1 = fired later than grace allows (still inside catch-up)',
  covered_until DATETIME(6) NULL COMMENT 'for a skipped range: every fire time from fire_at up to this (exclusive) was skipped',
  skipped_count INT UNSIGNED NULL COMMENT 'for a skipped range: how many fire times it covers',
  reason VARCHAR(32) NULL COMMENT 'why: outside_catchup, paused, queue_not_found, invalid_task (skipped) or deduplicated (created); NULL = a plain fire',
  created_at DATETIME(6) NOT NULL COMMENT 'time written',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_pulse_schedule_occurrences_fire (namespace_id, schedule_id, fire_at),
  CONSTRAINT ck_pulse_schedule_occurrences_task CHECK (outcome <> 'created' OR task_id IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Schedule occurrences: written once per (schedule, UTC fire time)';
