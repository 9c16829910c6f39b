-- Bookkeeping of orbit-migrate (orbit/migrate/store.py). The runner creates these two tables
-- itself before it applies any migration file, so migration files must not create them.
-- See docs/migrations.md. Statements here never contain ';' (one query per block).

-- name: migrations_table_create
CREATE TABLE IF NOT EXISTS orbit_schema_migrations (
  name VARCHAR(255) NOT NULL COMMENT 'migration file name, e.g. 0001_platform.sql',
  checksum BINARY(32) NOT NULL COMMENT 'SHA-256 of the file bytes as applied (or as accepted by repair)',
  statement_count INT UNSIGNED NOT NULL COMMENT 'number of statements in the file',
  applied_at DATETIME(6) NOT NULL COMMENT 'UTC time the file was recorded as applied',
  duration_ms BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'wall time spent applying the file in this run',
  method VARCHAR(16) NOT NULL DEFAULT 'up' COMMENT 'up: applied whole by up; resumed: finished by up after repair --resume; marked: repair --mark-applied; accepted: checksum replaced by repair --accept-checksum',
  runner VARCHAR(255) NOT NULL DEFAULT '' COMMENT 'host:pid of the orbit-migrate process that recorded the row',
  PRIMARY KEY (name),
  CONSTRAINT ck_orbit_schema_migrations_method CHECK (method IN ('up', 'resumed', 'marked', 'accepted'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='orbit-migrate: one row per applied migration file (forward-only)'

-- name: state_table_create
CREATE TABLE IF NOT EXISTS orbit_schema_state (
  id TINYINT UNSIGNED NOT NULL COMMENT 'always 1: the table holds at most one row',
  phase VARCHAR(16) NOT NULL COMMENT 'running: up is applying file (interrupted if no run holds the lock); failed: statement_index failed (dirty); resume: repair --resume, up continues at statement_index',
  file VARCHAR(255) NOT NULL COMMENT 'migration file being applied, failed or to resume',
  statement_index INT UNSIGNED NOT NULL COMMENT '1-based statement of file: running now, failed, or where up resumes',
  statement_count INT UNSIGNED NOT NULL COMMENT 'number of statements in file when the row was written',
  prefix_checksum BINARY(32) NOT NULL COMMENT 'SHA-256 over the statements before statement_index (length-prefixed), checked by repair --resume',
  error_code INT NULL COMMENT 'MySQL error number of the failed statement (phase failed)',
  error_message TEXT NULL COMMENT 'error text of the failed statement (phase failed)',
  statement_excerpt VARCHAR(1000) NOT NULL DEFAULT '' COMMENT 'first characters of the statement at statement_index',
  runner VARCHAR(255) NOT NULL DEFAULT '' COMMENT 'host:pid of the orbit-migrate process that wrote the row',
  started_at DATETIME(6) NOT NULL COMMENT 'UTC time the run started the file',
  updated_at DATETIME(6) NOT NULL COMMENT 'UTC time of the last change to the row',
  PRIMARY KEY (id),
  CONSTRAINT ck_orbit_schema_state_single CHECK (id = 1),
  CONSTRAINT ck_orbit_schema_state_phase CHECK (phase IN ('running', 'failed', 'resume'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='orbit-migrate: the dirty mark / progress of the file being applied (no row = clean)'

-- name: schema_exists
SELECT COUNT(*) AS n FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %(database)s

-- name: migrations_list
SELECT name, checksum, applied_at, method FROM orbit_schema_migrations

-- name: migration_insert
INSERT INTO orbit_schema_migrations
  (name, checksum, statement_count, applied_at, duration_ms, method, runner)
VALUES
  (%(name)s, %(checksum)s, %(statement_count)s, UTC_TIMESTAMP(6), %(duration_ms)s, %(method)s, %(runner)s)

-- name: migration_set_checksum
UPDATE orbit_schema_migrations
SET checksum = %(checksum)s, statement_count = %(statement_count)s, method = 'accepted', runner = %(runner)s
WHERE name = %(name)s

-- name: state_get
SELECT phase, file, statement_index, statement_count, prefix_checksum, error_code, error_message,
       statement_excerpt, runner, started_at, updated_at
FROM orbit_schema_state WHERE id = 1

-- name: state_begin
INSERT INTO orbit_schema_state
  (id, phase, file, statement_index, statement_count, prefix_checksum, error_code, error_message,
   statement_excerpt, runner, started_at, updated_at)
VALUES
  (1, 'running', %(file)s, %(statement_index)s, %(statement_count)s, %(prefix_checksum)s, NULL, NULL,
   %(statement_excerpt)s, %(runner)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  phase = 'running', file = VALUES(file), statement_index = VALUES(statement_index),
  statement_count = VALUES(statement_count), prefix_checksum = VALUES(prefix_checksum),
  error_code = NULL, error_message = NULL, statement_excerpt = VALUES(statement_excerpt),
  runner = VALUES(runner), started_at = VALUES(started_at), updated_at = VALUES(updated_at)

-- name: state_progress_if_running
UPDATE orbit_schema_state
SET statement_index = %(statement_index)s, prefix_checksum = %(prefix_checksum)s,
    statement_excerpt = %(statement_excerpt)s, updated_at = UTC_TIMESTAMP(6)
WHERE id = 1 AND phase = 'running' AND file = %(file)s

-- name: state_fail_if_running
UPDATE orbit_schema_state
SET phase = 'failed', error_code = %(error_code)s, error_message = %(error_message)s,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = 1 AND phase = 'running' AND file = %(file)s

-- name: state_resume
UPDATE orbit_schema_state
SET phase = 'resume', runner = %(runner)s, updated_at = UTC_TIMESTAMP(6)
WHERE id = 1 AND file = %(file)s

-- name: state_clear
DELETE FROM orbit_schema_state WHERE id = 1

-- name: foreign_keys_list
SELECT CONSTRAINT_NAME AS name, TABLE_NAME AS table_name, REFERENCED_TABLE_NAME AS referenced_table
FROM information_schema.REFERENTIAL_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = %(database)s
ORDER BY TABLE_NAME, CONSTRAINT_NAME

-- name: tables_list
SELECT TABLE_NAME AS name
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = %(database)s AND TABLE_TYPE = 'BASE TABLE'
ORDER BY TABLE_NAME

-- name: lock_get
SELECT GET_LOCK(%(name)s, %(timeout)s) AS got

-- name: lock_release
SELECT RELEASE_LOCK(%(name)s) AS released

-- name: lock_holder
SELECT IS_USED_LOCK(%(name)s) AS holder

-- name: user_exists
SELECT COUNT(*) AS n FROM mysql.user WHERE User = %(user)s AND Host = %(host)s

-- name: wsrep_on
SELECT @@GLOBAL.wsrep_on AS wsrep_on

-- name: cluster_lock_table_create
CREATE TABLE IF NOT EXISTS orbit_schema_lock (
  id TINYINT UNSIGNED NOT NULL COMMENT 'always 1: the table holds at most one row',
  holder VARCHAR(255) NOT NULL COMMENT 'host:pid of the orbit-migrate process holding the lock',
  token BINARY(16) NOT NULL COMMENT 'random token of the holding run: renewals and release name it',
  acquired_at DATETIME(6) NOT NULL COMMENT 'UTC time (database clock) the run took the lock',
  renewed_at DATETIME(6) NOT NULL COMMENT 'UTC time of the last renewal',
  expires_at DATETIME(6) NOT NULL COMMENT 'the lock is free after this UTC time unless renewed',
  PRIMARY KEY (id),
  CONSTRAINT ck_orbit_schema_lock_single CHECK (id = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='orbit-migrate: the cluster-wide migration lock on a Galera cluster (GET_LOCK is node-local there)'

-- name: cluster_lock_get_for_update
SELECT holder, token, expires_at <= UTC_TIMESTAMP(6) AS expired
FROM orbit_schema_lock WHERE id = 1 FOR UPDATE

-- name: cluster_lock_insert
INSERT INTO orbit_schema_lock (id, holder, token, acquired_at, renewed_at, expires_at)
VALUES (1, %(holder)s, %(token)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6) + INTERVAL %(ttl_s)s SECOND)

-- name: cluster_lock_take_if_token
UPDATE orbit_schema_lock
SET holder = %(holder)s, token = %(token)s, acquired_at = UTC_TIMESTAMP(6),
    renewed_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL %(ttl_s)s SECOND
WHERE id = 1 AND token = %(old_token)s

-- name: cluster_lock_renew
UPDATE orbit_schema_lock
SET renewed_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL %(ttl_s)s SECOND
WHERE id = 1 AND token = %(token)s AND expires_at > UTC_TIMESTAMP(6)

-- name: cluster_lock_release
DELETE FROM orbit_schema_lock WHERE id = 1 AND token = %(token)s

-- name: cluster_lock_live
SELECT holder FROM orbit_schema_lock WHERE id = 1 AND expires_at > UTC_TIMESTAMP(6)
