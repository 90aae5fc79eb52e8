//! The schema on MySQL and MariaDB (InnoDB), one migration per PostgreSQL migration from
//! here on. The first one creates, in one step, what PostgreSQL's migrations 1–24 built.
//!
//! `{table}` stands for the table options (InnoDB, utf8mb4 with a binary collation that does not
//! pad: ids compare byte for byte, `a` and `a ` are different ids). Names the protocol allows up
//! to 255 characters are `VARCHAR(255)`; a composite key over InnoDB's 3,072-byte limit is a
//! stored SHA-256 digest of its columns with a unique index, computed by the database, so the
//! shared statements insert the columns as on PostgreSQL. Partial indexes become full indexes.
//! DDL is not transactional here: every statement is `IF NOT EXISTS`, so a migration cut short
//! by a crash runs again cleanly.

pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (
        24,
        r#"
CREATE TABLE IF NOT EXISTS namespaces (name VARCHAR(255) PRIMARY KEY, description TEXT, created_at BIGINT NOT NULL, doc LONGTEXT) {table};
CREATE TABLE IF NOT EXISTS workflow_instances (workflow_id VARCHAR(255) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, current_run_id VARCHAR(64) NOT NULL, created_at BIGINT NOT NULL) {table};
CREATE TABLE IF NOT EXISTS runs (run_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, run_number BIGINT NOT NULL,
  workflow_type VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL, business_key TEXT,
  started_at BIGINT NOT NULL, closed_at BIGINT, state LONGTEXT NOT NULL,
  INDEX runs_by_namespace (namespace, started_at DESC, run_id DESC), INDEX runs_by_instance (workflow_id, run_number),
  INDEX runs_closed (namespace, closed_at)) {table};
CREATE TABLE IF NOT EXISTS history_events (run_id VARCHAR(64) NOT NULL, sequence BIGINT NOT NULL, event_id VARCHAR(64) NOT NULL, event_type VARCHAR(64) NOT NULL,
  payload LONGTEXT NOT NULL, workflow_task_id VARCHAR(64), workflow_command_id VARCHAR(255), recorded_at BIGINT NOT NULL,
  prev_hash CHAR(64) NOT NULL, hash CHAR(64) NOT NULL, PRIMARY KEY (run_id, sequence)) {table};
CREATE TABLE IF NOT EXISTS tasks (task_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, run_id VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL,
  queue VARCHAR(255) NOT NULL, type_name VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL, available_at BIGINT NOT NULL, deadline_at BIGINT,
  lease_owner VARCHAR(255), lease_expires_at BIGINT, fence BIGINT NOT NULL, created_at BIGINT NOT NULL, duty_owner VARCHAR(255),
  duty_fence BIGINT NOT NULL DEFAULT 0, duty_expires_at BIGINT, compatibility VARCHAR(255), sticky_owner VARCHAR(255), sticky_until BIGINT,
  session_id VARCHAR(255), receipt LONGTEXT,
  INDEX tasks_ready (status, namespace(128), kind, queue(255), available_at), INDEX tasks_deadline (status, deadline_at), INDEX tasks_by_run (run_id)) {table};
CREATE TABLE IF NOT EXISTS workers (namespace VARCHAR(255) NOT NULL, worker_id VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, runtime VARCHAR(64) NOT NULL,
  sdk_version VARCHAR(255), build_id VARCHAR(255), workflow_types LONGTEXT NOT NULL, activity_types LONGTEXT NOT NULL, fingerprints LONGTEXT NOT NULL,
  document LONGTEXT NOT NULL, status VARCHAR(32) NOT NULL, registered_at BIGINT NOT NULL, last_heartbeat_at BIGINT NOT NULL, PRIMARY KEY (namespace, worker_id)) {table};
CREATE TABLE IF NOT EXISTS poll_requests (namespace VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, worker_id VARCHAR(255) NOT NULL,
  kind VARCHAR(32) NOT NULL, poll_request_id VARCHAR(255) NOT NULL, task_id VARCHAR(64) NOT NULL, fence BIGINT NOT NULL, created_at BIGINT NOT NULL,
  poll_key CHAR(64) AS (SHA2(CONCAT_WS(CHAR(31), namespace, task_queue, worker_id, kind, poll_request_id), 256)) STORED,
  UNIQUE KEY poll_requests_key (poll_key), INDEX poll_requests_age (created_at)) {table};
CREATE TABLE IF NOT EXISTS command_requests (namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, command_type VARCHAR(64) NOT NULL,
  request_id VARCHAR(255) NOT NULL, intent_hash CHAR(64) NOT NULL, receipt LONGTEXT NOT NULL, created_at BIGINT NOT NULL,
  request_key CHAR(64) AS (SHA2(CONCAT_WS(CHAR(31), namespace, workflow_id, command_type, request_id), 256)) STORED,
  UNIQUE KEY command_requests_key (request_key)) {table};
CREATE TABLE IF NOT EXISTS query_tasks (query_task_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL,
  lease_expires_at BIGINT, created_at BIGINT NOT NULL, deadline_at BIGINT NOT NULL, doc LONGTEXT NOT NULL, kind VARCHAR(32) NOT NULL DEFAULT 'query',
  INDEX query_tasks_open_by_kind (namespace(128), task_queue(255), kind, status, created_at)) {table};
CREATE TABLE IF NOT EXISTS action_definitions (namespace VARCHAR(255) NOT NULL, activity_type VARCHAR(255) NOT NULL, version BIGINT NOT NULL, definition_hash CHAR(64) NOT NULL,
  updated_at BIGINT NOT NULL, doc LONGTEXT NOT NULL, PRIMARY KEY (namespace, activity_type)) {table};
CREATE TABLE IF NOT EXISTS ledger_entries (ledger_key VARCHAR(255) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, run_id VARCHAR(64) NOT NULL,
  activity_type VARCHAR(255) NOT NULL, state VARCHAR(32) NOT NULL, dispatched_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, doc LONGTEXT NOT NULL,
  INDEX ledger_by_state (namespace, state, dispatched_at), INDEX ledger_by_workflow (namespace, workflow_id, dispatched_at)) {table};
CREATE TABLE IF NOT EXISTS ledger_checkpoints (namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, hash CHAR(64) NOT NULL, prev_hash CHAR(64) NOT NULL,
  ledger_key VARCHAR(255) NOT NULL, recorded_at BIGINT NOT NULL, doc LONGTEXT NOT NULL, PRIMARY KEY (namespace, workflow_id, hash)) {table};
CREATE TABLE IF NOT EXISTS integrity_incidents (incident_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, run_id VARCHAR(64) NOT NULL,
  state VARCHAR(32) NOT NULL, opened_at BIGINT NOT NULL, doc LONGTEXT NOT NULL, INDEX integrity_incidents_by_state (namespace, state, opened_at)) {table};
CREATE TABLE IF NOT EXISTS search_attribute_index (run_id VARCHAR(64) NOT NULL, `key` VARCHAR(255) NOT NULL, value TEXT NOT NULL, num DOUBLE,
  INDEX search_attribute_lookup (`key`, value(255), run_id), INDEX search_attribute_by_run (run_id), INDEX search_attribute_numeric (`key`, num, run_id)) {table};
CREATE TABLE IF NOT EXISTS search_attribute_definitions (namespace VARCHAR(255) NOT NULL, name VARCHAR(255) NOT NULL, kind VARCHAR(32) NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY (namespace, name)) {table};
CREATE TABLE IF NOT EXISTS schedules (namespace VARCHAR(255) NOT NULL, schedule_id VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL, workflow_type VARCHAR(255) NOT NULL,
  wake_at BIGINT, has_buffer BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, doc LONGTEXT NOT NULL, PRIMARY KEY (namespace, schedule_id),
  INDEX schedules_due (wake_at), INDEX schedules_buffered (has_buffer)) {table};
CREATE TABLE IF NOT EXISTS schedule_events (namespace VARCHAR(255) NOT NULL, schedule_id VARCHAR(255) NOT NULL, sequence BIGINT NOT NULL, event_id VARCHAR(64) NOT NULL,
  event_type VARCHAR(64) NOT NULL, recorded_at BIGINT NOT NULL, workflow_id VARCHAR(255), run_id VARCHAR(64), payload LONGTEXT NOT NULL,
  PRIMARY KEY (namespace, schedule_id, sequence)) {table};
CREATE TABLE IF NOT EXISTS bridge_deliveries (namespace VARCHAR(255) NOT NULL, adapter VARCHAR(128) NOT NULL, idempotency_key VARCHAR(255) NOT NULL, outcome LONGTEXT NOT NULL,
  created_at BIGINT NOT NULL, PRIMARY KEY (namespace, adapter, idempotency_key)) {table};
CREATE TABLE IF NOT EXISTS build_id_rollouts (namespace VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, build_id VARCHAR(255) NOT NULL, drain_intent VARCHAR(32) NOT NULL,
  drained_at BIGINT, updated_at BIGINT NOT NULL, promoted_at BIGINT, PRIMARY KEY (namespace, task_queue, build_id)) {table};
CREATE TABLE IF NOT EXISTS worker_sessions (namespace VARCHAR(255) NOT NULL, session_id VARCHAR(255) NOT NULL, lease_owner VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL,
  lease_expires_at BIGINT NOT NULL, ttl_expires_at BIGINT NOT NULL, allow_reacquire INT NOT NULL, document LONGTEXT NOT NULL, PRIMARY KEY (namespace, session_id)) {table};
CREATE TABLE IF NOT EXISTS worker_deregistrations (namespace VARCHAR(255) NOT NULL, worker_id VARCHAR(255) NOT NULL, registration_token VARCHAR(255) NOT NULL,
  receipt LONGTEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (namespace, worker_id, registration_token)) {table};
CREATE TABLE IF NOT EXISTS workflow_streams (run_id VARCHAR(64) NOT NULL, stream_name VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL, last_offset BIGINT NOT NULL,
  total_items BIGINT NOT NULL, pending_items BIGINT NOT NULL, error_reason TEXT, opened_at BIGINT NOT NULL, last_appended_at BIGINT, closed_at BIGINT,
  retention_seconds BIGINT, PRIMARY KEY (run_id, stream_name)) {table};
CREATE TABLE IF NOT EXISTS workflow_stream_items (run_id VARCHAR(64) NOT NULL, stream_name VARCHAR(255) NOT NULL, item_offset BIGINT NOT NULL, idempotency_key VARCHAR(255),
  item LONGTEXT NOT NULL, PRIMARY KEY (run_id, stream_name, item_offset), UNIQUE INDEX workflow_stream_items_by_key (run_id, stream_name, idempotency_key)) {table};
CREATE TABLE IF NOT EXISTS external_payloads (reference_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, codec VARCHAR(64) NOT NULL, size_bytes BIGINT NOT NULL,
  sha256 CHAR(64) NOT NULL, location TEXT NOT NULL, created_at BIGINT NOT NULL, INDEX external_payloads_by_age (created_at)) {table};
CREATE TABLE IF NOT EXISTS external_payload_uses (reference_id VARCHAR(64) NOT NULL, namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL,
  PRIMARY KEY (reference_id, namespace, workflow_id), INDEX external_payload_uses_by_workflow (namespace, workflow_id)) {table};
CREATE TABLE IF NOT EXISTS service_catalog (namespace VARCHAR(255) NOT NULL, endpoint_name VARCHAR(255) NOT NULL, service_name VARCHAR(255) NOT NULL,
  operation_name VARCHAR(255) NOT NULL, entry_id VARCHAR(64) NOT NULL, doc LONGTEXT NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  catalog_key CHAR(64) AS (SHA2(CONCAT_WS(CHAR(31), namespace, endpoint_name, service_name, operation_name), 256)) STORED,
  UNIQUE KEY service_catalog_key (catalog_key)) {table};
CREATE TABLE IF NOT EXISTS service_calls (service_call_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, endpoint_name VARCHAR(255) NOT NULL,
  service_name VARCHAR(255) NOT NULL, operation_name VARCHAR(255) NOT NULL, idempotency_key VARCHAR(255) NOT NULL,
  caller_namespace VARCHAR(255) NOT NULL, caller_workflow_id VARCHAR(255), caller_run_id VARCHAR(64), linked_run_id VARCHAR(64), status VARCHAR(32) NOT NULL,
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, doc LONGTEXT NOT NULL,
  route_key CHAR(64) AS (SHA2(CONCAT_WS(CHAR(31), namespace, endpoint_name, service_name, operation_name, idempotency_key), 256)) STORED,
  UNIQUE KEY service_calls_by_route_key (route_key),
  INDEX service_calls_by_caller (caller_namespace, caller_workflow_id, created_at)) {table};
CREATE TABLE IF NOT EXISTS service_call_waiters (service_call_id VARCHAR(64) NOT NULL, caller_run_id VARCHAR(64) NOT NULL, sequence BIGINT NOT NULL,
  PRIMARY KEY (service_call_id, caller_run_id, sequence)) {table};
CREATE TABLE IF NOT EXISTS health_probe (id INT PRIMARY KEY, probed_at BIGINT NOT NULL) {table};
"#,
    ),
    (
        25,
        r#"
CREATE TABLE IF NOT EXISTS audit_events (audit_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL,
  run_id VARCHAR(64), action VARCHAR(64) NOT NULL, principal TEXT, recorded_at BIGINT NOT NULL, detail LONGTEXT NOT NULL,
  INDEX audit_events_by_instance (namespace(128), workflow_id(255), recorded_at)) {table};
"#,
    ),
    (
        26,
        r#"
CREATE TABLE IF NOT EXISTS credentials (principal VARCHAR(255) PRIMARY KEY, created_at BIGINT NOT NULL, doc LONGTEXT NOT NULL) {table};
"#,
    ),
    (
        27,
        r#"
CREATE TABLE IF NOT EXISTS credential_events (sequence BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, principal VARCHAR(255) NOT NULL,
  action VARCHAR(64) NOT NULL, secret_id VARCHAR(64), by_principal TEXT, recorded_at BIGINT NOT NULL, detail LONGTEXT NOT NULL,
  INDEX credential_events_by_principal (principal, sequence)) {table};
"#,
    ),
    (
        28,
        r#"
ALTER TABLE tasks ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5, ADD COLUMN fairness_key VARCHAR(64), ADD COLUMN fairness_weight SMALLINT NOT NULL DEFAULT 1;
CREATE INDEX tasks_dispatch ON tasks (status, namespace(128), kind, queue(255), priority, available_at);
"#,
    ),
    (
        29,
        r#"
CREATE TABLE IF NOT EXISTS queue_limits (namespace VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL, kind VARCHAR(32) NOT NULL,
  limits TEXT NOT NULL, bucket TEXT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (namespace, task_queue, kind)) {table};
"#,
    ),
    (
        30,
        r#"
ALTER TABLE tasks ADD COLUMN pending_lease TEXT;
"#,
    ),
    (
        31,
        r#"
CREATE INDEX tasks_fair ON tasks (status, namespace(128), kind, queue(255), fairness_key, priority, available_at);
"#,
    ),
    (
        32,
        r#"
ALTER TABLE tasks ADD COLUMN poll_request_id VARCHAR(255);
CREATE INDEX tasks_poll ON tasks (poll_request_id);
"#,
    ),
    (
        33,
        r#"
-- Runs counted per namespace, type, queue, class ('open' or a closed status) and whether they
-- are their instance's current run, kept in the transactions that change them
-- (logic/run_counts.rs); a key's count is spread over slots so writers do not queue on one row.
-- Namespace names are at most 128 characters (docs/limits.md): the key fits InnoDB's limit.
CREATE TABLE IF NOT EXISTS run_counts (namespace VARCHAR(128) NOT NULL, workflow_type VARCHAR(255) NOT NULL, task_queue VARCHAR(255) NOT NULL,
  run_class VARCHAR(16) NOT NULL, is_current INT NOT NULL, slot INT NOT NULL, n BIGINT NOT NULL,
  PRIMARY KEY (namespace, workflow_type, task_queue, run_class, is_current, slot)) {table};
DELETE FROM run_counts;
INSERT INTO run_counts (namespace, workflow_type, task_queue, run_class, is_current, slot, n)
SELECT r.namespace, r.workflow_type, r.task_queue,
       CASE WHEN r.status IN ('pending', 'running', 'waiting') THEN 'open' ELSE r.status END,
       CASE WHEN i.current_run_id = r.run_id THEN 1 ELSE 0 END, 0, COUNT(*)
FROM runs r LEFT JOIN workflow_instances i ON i.workflow_id = r.workflow_id
GROUP BY 1, 2, 3, 4, 5;
"#,
    ),
    (
        34,
        r#"
ALTER TABLE runs ADD COLUMN paused_at BIGINT;
"#,
    ),
    (
        35,
        r#"
CREATE TABLE IF NOT EXISTS batch_operations (batch_id VARCHAR(64) PRIMARY KEY, namespace VARCHAR(255) NOT NULL, action VARCHAR(32) NOT NULL,
  request LONGTEXT NOT NULL, state VARCHAR(16) NOT NULL, progress LONGTEXT NOT NULL, principal TEXT, request_id VARCHAR(255),
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, finished_at BIGINT, next_step_at BIGINT NOT NULL,
  duty_owner VARCHAR(255), duty_fence BIGINT NOT NULL, duty_expires_at BIGINT,
  UNIQUE KEY batch_operations_request (namespace, request_id), INDEX batch_operations_listed (namespace, created_at),
  INDEX batch_operations_due (state, next_step_at)) {table};
"#,
    ),
    (
        36,
        r#"
-- Whether a run is its instance's current run, kept by the transaction that makes a successor
-- current. A listing keeps current runs by a column of the row it reads already: a lookup of
-- the instance per run left PostgreSQL's planner guessing, and it sorted every run for a page.
ALTER TABLE runs ADD COLUMN is_current INT NOT NULL DEFAULT 1;
UPDATE runs r JOIN workflow_instances i ON i.workflow_id = r.workflow_id SET r.is_current = 0 WHERE i.current_run_id <> r.run_id;
"#,
    ),
];
