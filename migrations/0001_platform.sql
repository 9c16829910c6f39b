-- 0001_platform.sql: the platform tables (orbit_*).
--
-- Rules (docs/architecture.md, "Schema rules"): runtime rows have PRIMARY KEY (namespace_id, id),
-- ids BINARY(16), times DATETIME(6) UTC written by the application (no server-side defaults),
-- revision on mutable rows, a COMMENT on every table and column, named CHECKs unique across the
-- schema, zero foreign keys, immutable history guarded by BEFORE UPDATE/DELETE triggers.
-- Names are case-sensitive (API.md), so every table uses utf8mb4_bin.
-- Statements are split on semicolons outside quotes and comments: never put one in a comment.

CREATE TABLE orbit_applications (
  id BINARY(16) NOT NULL COMMENT 'Application id (128-bit random)',
  name VARCHAR(63) NOT NULL COMMENT 'Unique, case-sensitive name (API.md names rule)',
  status VARCHAR(16) NOT NULL COMMENT 'active or disabled (a disabled application authenticates nothing)',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, starts at 1, bumped by every update',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last update time (UTC)',
  PRIMARY KEY (id),
  UNIQUE KEY uq_orbit_applications_name (name),
  CONSTRAINT ck_orbit_applications_status CHECK (status IN ('active', 'disabled')),
  CONSTRAINT ck_orbit_applications_name CHECK (name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_orbit_applications_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Tenants: the owner (subject) of tasks, namespaces and credentials';

CREATE TABLE orbit_application_resources (
  application_id BINARY(16) NOT NULL COMMENT 'The application these quotas belong to (one row each)',
  max_unfinished_tasks BIGINT UNSIGNED NULL COMMENT 'Quota: unfinished tasks across all namespaces, NULL = unlimited',
  max_active_attempts BIGINT UNSIGNED NULL COMMENT 'Quota: attempts running at once, NULL = unlimited',
  max_reservations BIGINT UNSIGNED NULL COMMENT 'Quota: leased but not yet started attempts, NULL = unlimited',
  max_starts_per_second BIGINT UNSIGNED NULL COMMENT 'Quota: starts per one-second window, NULL = unlimited',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'Config revision (ETag). Usage changes never bump it',
  unfinished_tasks BIGINT NOT NULL DEFAULT 0 COMMENT 'Usage: tasks not yet in a terminal state',
  active_attempts BIGINT NOT NULL DEFAULT 0 COMMENT 'Usage: attempts currently running',
  reservations BIGINT NOT NULL DEFAULT 0 COMMENT 'Usage: attempts leased and not yet started',
  window_start DATETIME(6) NULL COMMENT 'Usage: start of the current one-second start window (database clock)',
  window_starts BIGINT NOT NULL DEFAULT 0 COMMENT 'Usage: starts counted in the window beginning at window_start',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last config update time (UTC)',
  PRIMARY KEY (application_id),
  CONSTRAINT ck_orbit_application_resources_usage CHECK (
    unfinished_tasks >= 0 AND active_attempts >= 0 AND reservations >= 0 AND window_starts >= 0),
  CONSTRAINT ck_orbit_application_resources_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Per-application quotas (config, revisioned) and live usage counters (not revisioned). Locked first in the lock order';

CREATE TABLE orbit_namespaces (
  id BINARY(16) NOT NULL COMMENT 'Namespace id: the namespace_id of every runtime row',
  application_id BINARY(16) NOT NULL COMMENT 'Owning application (no foreign key, checked by the service)',
  name VARCHAR(63) NOT NULL COMMENT 'Name, unique and case-sensitive within the application',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, starts at 1',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  PRIMARY KEY (id),
  UNIQUE KEY uq_orbit_namespaces_application_name (application_id, name),
  CONSTRAINT ck_orbit_namespaces_name CHECK (name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_orbit_namespaces_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Isolation boundary for runtime data. Belongs to one application';

CREATE TABLE orbit_credentials (
  id BINARY(16) NOT NULL COMMENT 'Credential id, also the public middle part of the API key',
  application_id BINARY(16) NOT NULL COMMENT 'Application the key acts for',
  name VARCHAR(128) NOT NULL COMMENT 'Human label (not unique)',
  secret_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the secret part of the key. The key itself is never stored',
  namespaces JSON NOT NULL COMMENT 'Allowed namespace ids as a JSON array of 32-hex strings, or the array with a single star for all',
  actions JSON NOT NULL COMMENT 'Allowed actions as a JSON array of strings (API.md actions)',
  queues JSON NULL COMMENT 'Allowed queue names as a JSON array, NULL = every queue',
  global_admin TINYINT NOT NULL DEFAULT 0 COMMENT '1 = may create and administer any application',
  expires_at DATETIME(6) NULL COMMENT 'Key stops authenticating at this time (UTC), NULL = never',
  revoked_at DATETIME(6) NULL COMMENT 'Revocation time (UTC), NULL = active',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped by revocation. Caches are keyed by it',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  PRIMARY KEY (id),
  KEY ix_orbit_credentials_application_name (application_id, name),
  CONSTRAINT ck_orbit_credentials_namespaces CHECK (JSON_VALID(namespaces) AND JSON_TYPE(namespaces) = 'ARRAY'),
  CONSTRAINT ck_orbit_credentials_actions CHECK (JSON_VALID(actions) AND JSON_TYPE(actions) = 'ARRAY'),
  CONSTRAINT ck_orbit_credentials_queues CHECK (queues IS NULL OR (JSON_VALID(queues) AND JSON_TYPE(queues) = 'ARRAY')),
  CONSTRAINT ck_orbit_credentials_global_admin CHECK (global_admin IN (0, 1)),
  CONSTRAINT ck_orbit_credentials_name CHECK (CHAR_LENGTH(name) BETWEEN 1 AND 128),
  CONSTRAINT ck_orbit_credentials_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='API keys: digest of the secret plus allowed namespaces, actions and queues, expiry and revocation';

CREATE TABLE orbit_idempotency_keys (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the request, all-zero for non-namespaced admin operations',
  id BINARY(16) NOT NULL COMMENT 'Row id',
  operation VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'Operation name, e.g. tasks.submit',
  scope VARCHAR(255) NOT NULL COMMENT 'Resource scope inside the namespace (e.g. the application id or a queue name), empty when none',
  idem_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'The Idempotency-Key header (1-128 printable ASCII)',
  request_digest BINARY(32) NOT NULL COMMENT 'SHA-256 of the canonical request (method, path, canonical JSON body)',
  response_status SMALLINT UNSIGNED NULL COMMENT 'Stored response status, NULL until stored in the same transaction as the effect',
  response_body MEDIUMTEXT NULL COMMENT 'Stored response body bytes (UTF-8 JSON), replayed verbatim',
  created_at DATETIME(6) NOT NULL COMMENT 'First request time (UTC)',
  expires_at DATETIME(6) NOT NULL COMMENT 'End of the retention window, after which the key may be reused',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_orbit_idempotency_keys_key (namespace_id, operation, scope, idem_key),
  KEY ix_orbit_idempotency_keys_expires (expires_at),
  CONSTRAINT ck_orbit_idempotency_keys_key CHECK (CHAR_LENGTH(idem_key) BETWEEN 1 AND 128),
  CONSTRAINT ck_orbit_idempotency_keys_status CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599),
  CONSTRAINT ck_orbit_idempotency_keys_response CHECK ((response_status IS NULL) = (response_body IS NULL)),
  CONSTRAINT ck_orbit_idempotency_keys_expiry CHECK (expires_at > created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Idempotency-Key records: request digest plus the original response, kept for a retention window';

CREATE TABLE orbit_events (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the state change',
  id BINARY(16) NOT NULL COMMENT 'Event id',
  type VARCHAR(64) NOT NULL COMMENT 'Event type, e.g. task.accepted, schedule.fired',
  subject_kind VARCHAR(32) NOT NULL COMMENT 'Kind of the changed resource, e.g. task, queue, schedule, instance',
  subject_id BINARY(16) NULL COMMENT 'Id of the changed resource, NULL when it has none',
  data JSON NOT NULL COMMENT 'Event details (platform metadata)',
  request_id VARCHAR(64) NULL COMMENT 'X-Request-Id of the HTTP request that caused it, NULL for background work',
  created_at DATETIME(6) NOT NULL COMMENT 'Time of the change (UTC)',
  PRIMARY KEY (namespace_id, id),
  KEY ix_orbit_events_subject (namespace_id, subject_kind, subject_id, created_at),
  KEY ix_orbit_events_created (namespace_id, created_at),
  CONSTRAINT ck_orbit_events_data CHECK (JSON_VALID(data))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Raw immutable record of every state change, written in the transaction of the change';

CREATE TRIGGER trg_orbit_events_no_update BEFORE UPDATE ON orbit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is immutable';

CREATE TRIGGER trg_orbit_events_no_delete BEFORE DELETE ON orbit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is immutable';

CREATE TABLE orbit_event_streams (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace whose result-event sequence this row counts',
  last_seq BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Last sequence number taken. Only ever grows, so it is its own version',
  updated_at DATETIME(6) NOT NULL COMMENT 'Time the last sequence number was taken (UTC)',
  PRIMARY KEY (namespace_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Per-namespace result-event sequence. Locked last in a transaction, only for the increment';

CREATE TABLE orbit_result_events (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the task',
  seq BIGINT UNSIGNED NOT NULL COMMENT 'Position in the namespace stream (1, 2, ...), gap-free per committed batch',
  event_id BINARY(16) NOT NULL COMMENT 'Event id (32 hex outside), unique per namespace',
  type VARCHAR(32) NOT NULL COMMENT 'task.succeeded, task.failed, task.cancelled or task.needs_review',
  task_id BINARY(16) NOT NULL COMMENT 'Snapshot: task id',
  queue VARCHAR(63) NOT NULL COMMENT 'Snapshot: queue name',
  kind VARCHAR(255) NULL COMMENT 'Snapshot: task kind',
  owner_id BINARY(16) NOT NULL COMMENT 'Snapshot: owning application id',
  state VARCHAR(16) NOT NULL COMMENT 'Snapshot: task state',
  result MEDIUMTEXT NULL COMMENT 'Snapshot: result JSON text exactly as reported, NULL when none',
  error JSON NULL COMMENT 'Snapshot: error object, NULL when none',
  attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Snapshot: attempts made',
  finished_at DATETIME(6) NULL COMMENT 'Snapshot: finish time (NULL for NEEDS_REVIEW)',
  created_at DATETIME(6) NOT NULL COMMENT 'Time the event was written (UTC)',
  PRIMARY KEY (namespace_id, seq),
  UNIQUE KEY uq_orbit_result_events_event (namespace_id, event_id),
  KEY ix_orbit_result_events_task (namespace_id, task_id),
  CONSTRAINT ck_orbit_result_events_type CHECK (
    type IN ('task.succeeded', 'task.failed', 'task.cancelled', 'task.needs_review')),
  CONSTRAINT ck_orbit_result_events_state CHECK (
    state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'NEEDS_REVIEW')),
  CONSTRAINT ck_orbit_result_events_type_state CHECK (type = CONCAT('task.', LOWER(state))),
  CONSTRAINT ck_orbit_result_events_result CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_orbit_result_events_error CHECK (error IS NULL OR JSON_VALID(error)),
  CONSTRAINT ck_orbit_result_events_seq CHECK (seq >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Immutable result events: frozen task snapshots in per-namespace sequence order';

CREATE TRIGGER trg_orbit_result_events_no_update BEFORE UPDATE ON orbit_result_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_result_events is immutable';

CREATE TRIGGER trg_orbit_result_events_no_delete BEFORE DELETE ON orbit_result_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_result_events is immutable';

CREATE TABLE orbit_subscriptions (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the subscription',
  id BINARY(16) NOT NULL COMMENT 'Subscription id',
  name VARCHAR(63) NOT NULL COMMENT 'Name, unique and case-sensitive within the namespace',
  filter JSON NOT NULL COMMENT 'Selection: object with optional queues, kinds, states, owner_id',
  start_spec JSON NOT NULL COMMENT 'Start position as given: "earliest", "latest" or an object with after_seq',
  after_seq BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Scan position: result events up to this seq have been turned into deliveries. Not part of revision',
  ack_timeout_ms INT UNSIGNED NOT NULL COMMENT 'Lease of one delivery before it is redelivered (ms)',
  max_deliveries INT UNSIGNED NOT NULL COMMENT 'Initial attempt budget of each delivery',
  max_in_flight INT UNSIGNED NOT NULL COMMENT 'At most this many leased, unacked deliveries at once',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'Config revision (ETag)',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last config update time (UTC)',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_orbit_subscriptions_name (namespace_id, name),
  CONSTRAINT ck_orbit_subscriptions_name CHECK (name REGEXP '^[A-Za-z0-9_.-]{1,63}$'),
  CONSTRAINT ck_orbit_subscriptions_filter CHECK (JSON_VALID(filter) AND JSON_TYPE(filter) = 'OBJECT'),
  CONSTRAINT ck_orbit_subscriptions_start CHECK (JSON_VALID(start_spec)),
  CONSTRAINT ck_orbit_subscriptions_limits CHECK (
    ack_timeout_ms >= 1 AND max_deliveries >= 1 AND max_in_flight >= 1),
  CONSTRAINT ck_orbit_subscriptions_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Subscriptions: a filter over result events, a start position and delivery limits';

CREATE TABLE orbit_deliveries (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace of the subscription',
  id BINARY(16) NOT NULL COMMENT 'Delivery id, kept across redeliveries',
  subscription_id BINARY(16) NOT NULL COMMENT 'Subscription this delivery belongs to',
  seq BIGINT UNSIGNED NOT NULL COMMENT 'Result event sequence number delivered',
  event_id BINARY(16) NOT NULL COMMENT 'Result event id delivered',
  state VARCHAR(16) NOT NULL COMMENT 'PENDING, LEASED, ACKED or EXHAUSTED',
  proof_digest BINARY(32) NULL COMMENT 'SHA-256 of the one-time proof of the current lease, NULL when not leased yet',
  attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'Times this delivery has been handed out',
  budget INT UNSIGNED NOT NULL COMMENT 'Total attempts allowed (max_deliveries plus operator additions)',
  lease_expires_at DATETIME(6) NULL COMMENT 'End of the current lease (database clock), NULL when not leased',
  next_at DATETIME(6) NOT NULL COMMENT 'PENDING: earliest next hand-out (backoff). LEASED: equals lease_expires_at, so ix_orbit_deliveries_due also finds expired leases',
  acked_at DATETIME(6) NULL COMMENT 'Ack time (UTC), NULL until acked',
  revision BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'CAS revision, bumped by every state change',
  created_at DATETIME(6) NOT NULL COMMENT 'Creation time (UTC)',
  updated_at DATETIME(6) NOT NULL COMMENT 'Last change time (UTC)',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_orbit_deliveries_subscription_seq (namespace_id, subscription_id, seq),
  KEY ix_orbit_deliveries_due (namespace_id, subscription_id, state, next_at, seq),
  KEY ix_orbit_deliveries_state_seq (namespace_id, subscription_id, state, seq),
  CONSTRAINT ck_orbit_deliveries_state CHECK (state IN ('PENDING', 'LEASED', 'ACKED', 'EXHAUSTED')),
  CONSTRAINT ck_orbit_deliveries_acked CHECK ((state = 'ACKED') = (acked_at IS NOT NULL)),
  CONSTRAINT ck_orbit_deliveries_leased CHECK (
    state <> 'LEASED' OR (lease_expires_at IS NOT NULL AND proof_digest IS NOT NULL)),
  CONSTRAINT ck_orbit_deliveries_budget CHECK (budget >= 1 AND attempts <= budget),
  CONSTRAINT ck_orbit_deliveries_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='One row per (subscription, result event): lease, proof, attempt budget and history';

CREATE TABLE orbit_audit_events (
  namespace_id BINARY(16) NOT NULL COMMENT 'Namespace acted on, all-zero for application-level and global actions',
  id BINARY(16) NOT NULL COMMENT 'Audit event id',
  credential_id BINARY(16) NULL COMMENT 'Actor: credential used, NULL for the CLI acting directly on the database',
  application_id BINARY(16) NULL COMMENT 'Actor: application of the credential, NULL for the CLI',
  action VARCHAR(64) NOT NULL COMMENT 'What was attempted, e.g. applications.create, credentials.revoke, tasks.submit',
  resource_kind VARCHAR(32) NOT NULL COMMENT 'Kind of the target resource, e.g. application, namespace, credential, queue',
  resource_id VARCHAR(255) NULL COMMENT 'Target id (32 hex) or name, NULL when not known',
  outcome VARCHAR(16) NOT NULL COMMENT 'ok, denied, conflict or error',
  status_code SMALLINT UNSIGNED NOT NULL COMMENT 'HTTP status answered (0 for the CLI)',
  request_id VARCHAR(64) NULL COMMENT 'X-Request-Id of the request',
  details JSON NULL COMMENT 'Extra facts (error code, conflict kind), never secrets',
  created_at DATETIME(6) NOT NULL COMMENT 'Time of the action (UTC)',
  PRIMARY KEY (namespace_id, id),
  KEY ix_orbit_audit_events_created (namespace_id, created_at),
  CONSTRAINT ck_orbit_audit_events_outcome CHECK (outcome IN ('ok', 'denied', 'conflict', 'error')),
  CONSTRAINT ck_orbit_audit_events_status CHECK (status_code = 0 OR status_code BETWEEN 100 AND 599),
  CONSTRAINT ck_orbit_audit_events_details CHECK (details IS NULL OR JSON_VALID(details))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Immutable audit trail: who did what to which resource, with what outcome';

CREATE TRIGGER trg_orbit_audit_events_no_update BEFORE UPDATE ON orbit_audit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_audit_events is immutable';

CREATE TRIGGER trg_orbit_audit_events_no_delete BEFORE DELETE ON orbit_audit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_audit_events is immutable'
