//! The SQLite schema and its migrations. Migrations are append-only: never edit a shipped one.

use rusqlite::Connection;

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
CREATE TABLE namespaces (
    name        TEXT PRIMARY KEY,
    description TEXT,
    created_at  INTEGER NOT NULL
);

-- Workflow ids are reserved across namespaces for all time.
CREATE TABLE workflow_instances (
    workflow_id    TEXT PRIMARY KEY,
    namespace      TEXT NOT NULL,
    current_run_id TEXT NOT NULL,
    created_at     INTEGER NOT NULL
);

-- One row per run. `state` is the engine's RunState document; the other columns are copies
-- for listing and filtering.
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    namespace     TEXT NOT NULL,
    workflow_id   TEXT NOT NULL,
    run_number    INTEGER NOT NULL,
    workflow_type TEXT NOT NULL,
    task_queue    TEXT NOT NULL,
    status        TEXT NOT NULL,
    business_key  TEXT,
    started_at    INTEGER NOT NULL,
    closed_at     INTEGER,
    state         TEXT NOT NULL
);
CREATE INDEX runs_by_namespace ON runs (namespace, started_at DESC, run_id DESC);
CREATE INDEX runs_by_instance ON runs (workflow_id, run_number);

-- Append-only history with its hash chain.
CREATE TABLE history_events (
    run_id              TEXT NOT NULL,
    sequence            INTEGER NOT NULL,
    event_id            TEXT NOT NULL,
    event_type          TEXT NOT NULL,
    payload             TEXT NOT NULL,
    workflow_task_id    TEXT,
    workflow_command_id TEXT,
    recorded_at         INTEGER NOT NULL,
    prev_hash           TEXT NOT NULL,
    hash                TEXT NOT NULL,
    PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;

-- Every task ever created. Open tasks mirror the engine's RunState.tasks; closed ones keep
-- their row so late reports can be traced to their run.
CREATE TABLE tasks (
    task_id          TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    kind             TEXT NOT NULL,
    queue            TEXT NOT NULL,
    type_name        TEXT NOT NULL,
    status           TEXT NOT NULL,
    available_at     INTEGER NOT NULL,
    deadline_at      INTEGER,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    fence            INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    -- Background duty lease: which node is processing this task's deadline, under which fence.
    duty_owner       TEXT,
    duty_fence       INTEGER NOT NULL DEFAULT 0,
    duty_expires_at  INTEGER
);
CREATE INDEX tasks_ready ON tasks (namespace, kind, queue, available_at) WHERE status = 'ready';
CREATE INDEX tasks_deadline ON tasks (deadline_at) WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased');

CREATE TABLE workers (
    namespace         TEXT NOT NULL,
    worker_id         TEXT NOT NULL,
    task_queue        TEXT NOT NULL,
    runtime           TEXT NOT NULL,
    sdk_version       TEXT,
    build_id          TEXT,
    workflow_types    TEXT NOT NULL,
    activity_types    TEXT NOT NULL,
    fingerprints      TEXT NOT NULL,
    document          TEXT NOT NULL,
    status            TEXT NOT NULL,
    registered_at     INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);

CREATE TABLE poll_requests (
    namespace       TEXT NOT NULL,
    task_queue      TEXT NOT NULL,
    worker_id       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    poll_request_id TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    fence           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (namespace, task_queue, worker_id, kind, poll_request_id)
);
CREATE INDEX poll_requests_age ON poll_requests (created_at);

CREATE TABLE command_requests (
    namespace    TEXT NOT NULL,
    workflow_id  TEXT NOT NULL,
    command_type TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    intent_hash  TEXT NOT NULL,
    receipt      TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (namespace, workflow_id, command_type, request_id)
);
"#,
    ),
    (
        2,
        r#"
-- Ephemeral query tasks. `doc` is the engine's QueryTask; the columns are copies for claiming.
CREATE TABLE query_tasks (
    query_task_id    TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    task_queue       TEXT NOT NULL,
    status           TEXT NOT NULL,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    deadline_at      INTEGER NOT NULL,
    doc              TEXT NOT NULL
);
CREATE INDEX query_tasks_open ON query_tasks (namespace, task_queue, created_at) WHERE status <> 'answered';
"#,
    ),
    (
        3,
        r#"
-- One row per (run, search attribute value): what list filters match against.
CREATE TABLE search_attribute_index (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL
);
CREATE INDEX search_attribute_lookup ON search_attribute_index (key, value, run_id);
CREATE INDEX search_attribute_by_run ON search_attribute_index (run_id);
"#,
    ),
    (
        4,
        r#"
-- Query tasks also carry update validations; pollers ask for one kind.
ALTER TABLE query_tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'query';
CREATE INDEX query_tasks_open_by_kind ON query_tasks (namespace, task_queue, kind, created_at) WHERE status <> 'answered';
"#,
    ),
    (
        5,
        r#"
-- The recovery ledger: declared actions, one entry per dispatch, and the checkpoint chain.
CREATE TABLE action_definitions (
    namespace       TEXT NOT NULL,
    activity_type   TEXT NOT NULL,
    version         INTEGER NOT NULL,
    definition_hash TEXT NOT NULL,
    updated_at      INTEGER NOT NULL,
    doc             TEXT NOT NULL,
    PRIMARY KEY (namespace, activity_type)
);
CREATE TABLE ledger_entries (
    ledger_key    TEXT PRIMARY KEY,
    namespace     TEXT NOT NULL,
    workflow_id   TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    activity_type TEXT NOT NULL,
    state         TEXT NOT NULL,
    dispatched_at INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    doc           TEXT NOT NULL
);
CREATE INDEX ledger_by_state ON ledger_entries (namespace, state, dispatched_at);
CREATE INDEX ledger_by_workflow ON ledger_entries (namespace, workflow_id, dispatched_at);
CREATE TABLE ledger_checkpoints (
    namespace   TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    hash        TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    ledger_key  TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    doc         TEXT NOT NULL,
    PRIMARY KEY (namespace, workflow_id, hash)
);
"#,
    ),
    (
        6,
        r#"
-- Integrity incidents: a ledger chain that failed verification on a commit, and what was done.
CREATE TABLE integrity_incidents (
    incident_id TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    state       TEXT NOT NULL,
    opened_at   INTEGER NOT NULL,
    doc         TEXT NOT NULL
);
CREATE INDEX integrity_incidents_by_state ON integrity_incidents (namespace, state, opened_at);
"#,
    ),
    (
        7,
        r#"
-- Namespaces carry a document (retention, status, timestamps) beside their name.
ALTER TABLE namespaces ADD COLUMN doc TEXT;
"#,
    ),
    (
        8,
        r#"
-- Schedules: the engine's Schedule document plus copies for the scheduler and listing. A
-- deleted schedule keeps its row (status 'deleted') so its history stays readable.
CREATE TABLE schedules (
    namespace     TEXT NOT NULL,
    schedule_id   TEXT NOT NULL,
    status        TEXT NOT NULL,
    workflow_type TEXT NOT NULL,
    wake_at       INTEGER,
    has_buffer    INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL,
    doc           TEXT NOT NULL,
    PRIMARY KEY (namespace, schedule_id)
);
CREATE INDEX schedules_due ON schedules (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX schedules_buffered ON schedules (has_buffer) WHERE has_buffer = 1;
-- Append-only audit history per schedule id (it outlives the schedule).
CREATE TABLE schedule_events (
    namespace    TEXT NOT NULL,
    schedule_id  TEXT NOT NULL,
    sequence     INTEGER NOT NULL,
    event_id     TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    recorded_at  INTEGER NOT NULL,
    workflow_id  TEXT,
    run_id       TEXT,
    payload      TEXT NOT NULL,
    PRIMARY KEY (namespace, schedule_id, sequence)
);
"#,
    ),
    (
        9,
        r#"
-- The retention duty finds closed runs by age.
CREATE INDEX runs_closed ON runs (namespace, closed_at) WHERE closed_at IS NOT NULL;
"#,
    ),
    (
        10,
        r#"
-- Typed custom search attributes per namespace, and the numeric form of each indexed value
-- (ints, doubles, datetimes as epoch ms, bools as 0/1) for range filters.
CREATE TABLE search_attribute_definitions (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
ALTER TABLE search_attribute_index ADD COLUMN num REAL;
CREATE INDEX search_attribute_numeric ON search_attribute_index (key, num, run_id);
"#,
    ),
    (
        11,
        r#"
-- Build-id rollout intents per task queue ('' is the unversioned cohort).
CREATE TABLE build_id_rollouts (
    namespace    TEXT NOT NULL,
    task_queue   TEXT NOT NULL,
    build_id     TEXT NOT NULL,
    drain_intent TEXT NOT NULL,
    drained_at   INTEGER,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (namespace, task_queue, build_id)
);
"#,
    ),
    (
        12,
        r#"
-- Accepted bridge-adapter deliveries by (adapter, idempotency key): a repeat is answered from
-- here and has no second effect.
CREATE TABLE bridge_deliveries (
    namespace       TEXT NOT NULL,
    adapter         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (namespace, adapter, idempotency_key)
);
"#,
    ),
    (
        13,
        r#"
-- The worker build a pinned run's workflow tasks are reserved for (NULL: any worker).
ALTER TABLE tasks ADD COLUMN compatibility TEXT;
"#,
    ),
    (
        14,
        r#"
-- The cohort promoted for new starts on a queue (at most one row has it).
ALTER TABLE build_id_rollouts ADD COLUMN promoted_at INTEGER;
"#,
    ),
    (
        15,
        r#"
-- The readiness probe's one row: after a failed commit, /api/ready writes it to learn whether
-- the database takes writes again.
CREATE TABLE health_probe (id INTEGER PRIMARY KEY, probed_at INTEGER NOT NULL);
"#,
    ),
    (
        16,
        r#"
-- Sticky execution: the worker a ready workflow task is held for, and until when (NULL: any).
ALTER TABLE tasks ADD COLUMN sticky_owner TEXT;
ALTER TABLE tasks ADD COLUMN sticky_until INTEGER;
"#,
    ),
    (
        17,
        r#"
-- Worker sessions (the engine's WorkerSession as JSON, plus what claims filter on), and the
-- session an activity task must run in.
CREATE TABLE worker_sessions (
    namespace        TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    lease_owner      TEXT NOT NULL,
    status           TEXT NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    ttl_expires_at   INTEGER NOT NULL,
    allow_reacquire  INTEGER NOT NULL,
    document         TEXT NOT NULL,
    PRIMARY KEY (namespace, session_id)
);
ALTER TABLE tasks ADD COLUMN session_id TEXT;
"#,
    ),
    (
        18,
        r#"
-- Receipts of fenced worker deregistrations, kept for a while so that a retried request gets
-- the same answer.
CREATE TABLE worker_deregistrations (
    namespace          TEXT NOT NULL,
    worker_id          TEXT NOT NULL,
    registration_token TEXT NOT NULL,
    receipt            TEXT NOT NULL,
    created_at         INTEGER NOT NULL,
    PRIMARY KEY (namespace, worker_id, registration_token)
);
"#,
    ),
    (
        19,
        r#"
-- The receipt a worker's report got when it closed the task: a retried report is answered
-- from it (it used to ride in the run document).
ALTER TABLE tasks ADD COLUMN receipt TEXT;
"#,
    ),
    (
        20,
        r#"
-- Workflow output streams: one row per (run, stream) with its counters, one row per item
-- (`item` is its JSON). Idempotency keys are unique per stream.
CREATE TABLE workflow_streams (
    run_id            TEXT NOT NULL,
    stream_name       TEXT NOT NULL,
    status            TEXT NOT NULL,
    last_offset       INTEGER NOT NULL,
    total_items       INTEGER NOT NULL,
    pending_items     INTEGER NOT NULL,
    error_reason      TEXT,
    opened_at         INTEGER NOT NULL,
    last_appended_at  INTEGER,
    closed_at         INTEGER,
    retention_seconds INTEGER,
    PRIMARY KEY (run_id, stream_name)
);
CREATE TABLE workflow_stream_items (
    run_id          TEXT NOT NULL,
    stream_name     TEXT NOT NULL,
    item_offset     INTEGER NOT NULL,
    idempotency_key TEXT,
    item            TEXT NOT NULL,
    PRIMARY KEY (run_id, stream_name, item_offset)
);
CREATE UNIQUE INDEX workflow_stream_items_by_key ON workflow_stream_items (run_id, stream_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"#,
    ),
    (
        21,
        r#"
-- External payload storage: one row per payload uploaded to the runtime transport (its bytes
-- are in the namespace's object store at `location`), and which workflow instances' stored
-- state names it. A payload no instance uses, past its grace period, is deleted with its bytes.
CREATE TABLE external_payloads (
    reference_id TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    codec        TEXT NOT NULL,
    size_bytes   INTEGER NOT NULL,
    sha256       TEXT NOT NULL,
    location     TEXT NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE INDEX external_payloads_by_age ON external_payloads (created_at);
CREATE TABLE external_payload_uses (
    reference_id TEXT NOT NULL,
    namespace    TEXT NOT NULL,
    workflow_id  TEXT NOT NULL,
    PRIMARY KEY (reference_id, namespace, workflow_id)
);
CREATE INDEX external_payload_uses_by_workflow ON external_payload_uses (namespace, workflow_id);
"#,
    ),
    (
        22,
        r#"
-- The Nexus service catalog of a namespace: endpoints, their services, and the services'
-- operations, one row each ('' for the levels below the row's own). `doc` holds the entry's
-- description, metadata and (operations) mode, handler binding and policies.
CREATE TABLE service_catalog (
    namespace      TEXT NOT NULL,
    endpoint_name  TEXT NOT NULL,
    service_name   TEXT NOT NULL,
    operation_name TEXT NOT NULL,
    entry_id       TEXT NOT NULL,
    doc            TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (namespace, endpoint_name, service_name, operation_name)
);
"#,
    ),
    (
        23,
        r#"
-- Nexus service calls: one row per admitted call, unique per target route and idempotency
-- key (a second admission of a key finds the first); `doc` is the engine's record (its
-- surface). `service_call_waiters` are the caller steps waiting for a call's completion.
CREATE TABLE service_calls (
    service_call_id    TEXT PRIMARY KEY,
    namespace          TEXT NOT NULL,
    endpoint_name      TEXT NOT NULL,
    service_name       TEXT NOT NULL,
    operation_name     TEXT NOT NULL,
    idempotency_key    TEXT NOT NULL,
    caller_namespace   TEXT NOT NULL,
    caller_workflow_id TEXT,
    caller_run_id      TEXT,
    linked_run_id      TEXT,
    status             TEXT NOT NULL,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    doc                TEXT NOT NULL
);
CREATE UNIQUE INDEX service_calls_by_route_key ON service_calls (namespace, endpoint_name, service_name, operation_name, idempotency_key);
CREATE INDEX service_calls_by_caller ON service_calls (caller_namespace, caller_workflow_id, created_at);
CREATE TABLE service_call_waiters (
    service_call_id TEXT NOT NULL,
    caller_run_id   TEXT NOT NULL,
    sequence        INTEGER NOT NULL,
    PRIMARY KEY (service_call_id, caller_run_id, sequence)
);
"#,
    ),
    (
        24,
        r#"
-- The audit trail of what requests did to an instance without writing its history (queries):
-- who asked what, when. Pruned with the instance.
CREATE TABLE audit_events (
    audit_id    TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    run_id      TEXT,
    action      TEXT NOT NULL,
    principal   TEXT,
    recorded_at INTEGER NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX audit_events_by_instance ON audit_events (namespace, workflow_id, recorded_at);
"#,
    ),
    (
        25,
        r#"
-- Named credentials managed over the admin API (the credentials file holds the others): the
-- principal, its roles and namespaces, and its secrets as SHA-256 digests, in `doc`.
CREATE TABLE credentials (
    principal  TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    doc        TEXT NOT NULL
);
"#,
    ),
    (
        26,
        r#"
-- The audit trail of the credentials managed over the admin API: every committed change, who
-- made it and the grants it left, never a secret or a digest. Kept for good.
CREATE TABLE credential_events (
    sequence     INTEGER PRIMARY KEY AUTOINCREMENT,
    principal    TEXT NOT NULL,
    action       TEXT NOT NULL,
    secret_id    TEXT,
    by_principal TEXT,
    recorded_at  INTEGER NOT NULL,
    detail       TEXT NOT NULL
);
CREATE INDEX credential_events_by_principal ON credential_events (principal, sequence);
"#,
    ),
    (
        27,
        r#"
-- Priority and fairness (DW's task-queue priority and fairness contract): a run's tasks carry
-- its priority (0 first) and fairness class, and a poller's candidates are read in priority
-- order.
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
ALTER TABLE tasks ADD COLUMN fairness_key TEXT;
ALTER TABLE tasks ADD COLUMN fairness_weight INTEGER NOT NULL DEFAULT 1;
CREATE INDEX tasks_dispatch ON tasks (namespace, kind, queue, priority, available_at) WHERE status = 'ready';
-- A queue's leased tasks, counted by every claim of a queue with a leased-task cap.
CREATE INDEX tasks_leased ON tasks (namespace, kind, queue) WHERE status = 'leased';
"#,
    ),
    (
        28,
        r#"
-- Flow control an operator sets per queue and task kind: the limits (JSON) and the rate
-- limit's token bucket (JSON), locked by every claim of the queue.
CREATE TABLE queue_limits (
    namespace   TEXT NOT NULL,
    task_queue  TEXT NOT NULL,
    kind        TEXT NOT NULL,
    limits      TEXT NOT NULL,
    bucket      TEXT NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (namespace, task_queue, kind)
);
"#,
    ),
    (
        29,
        r#"
-- A claim's workflow-task lease kept on the task row alone until the run's next writer folds
-- it into the run document (the lease's inputs as JSON; NULL once the document holds it).
ALTER TABLE tasks ADD COLUMN pending_lease TEXT;
"#,
    ),
    (
        30,
        r#"
-- The oldest ready task of each fairness class, read by a claim so that a class whose whole
-- backlog arrived after another's still gets its share.
CREATE INDEX tasks_fair ON tasks (namespace, kind, queue, fairness_key, priority, available_at) WHERE status = 'ready';
"#,
    ),
    (
        31,
        r#"
-- The poll request id of the poll that took the task's current lease, so that a retry of that
-- poll (its answer was lost) gets the same lease back. Written with the lease, in the same
-- statement, instead of a row of its own in poll_requests (kept for older binaries' rows).
ALTER TABLE tasks ADD COLUMN poll_request_id TEXT;
CREATE INDEX tasks_poll ON tasks (poll_request_id) WHERE poll_request_id IS NOT NULL;
"#,
    ),
    (
        32,
        r#"
-- Runs counted per namespace, type, queue, class ('open' or a closed status) and whether they
-- are their instance's current run, kept in the transactions that change them
-- (logic/run_counts.rs); a key's count is spread over slots so writers do not queue on one row.
CREATE TABLE run_counts (
    namespace     TEXT NOT NULL,
    workflow_type TEXT NOT NULL,
    task_queue    TEXT NOT NULL,
    run_class     TEXT NOT NULL,
    is_current    INTEGER NOT NULL,
    slot          INTEGER NOT NULL,
    n             INTEGER NOT NULL,
    PRIMARY KEY (namespace, workflow_type, task_queue, run_class, is_current, slot)
);
INSERT INTO run_counts (namespace, workflow_type, task_queue, run_class, is_current, slot, n)
SELECT r.namespace, r.workflow_type, r.task_queue,
       CASE WHEN r.status IN ('pending', 'running', 'waiting') THEN 'open' ELSE r.status END,
       CASE WHEN i.current_run_id = r.run_id THEN 1 ELSE 0 END, 0, COUNT(*)
FROM runs r LEFT JOIN workflow_instances i ON i.workflow_id = r.workflow_id
GROUP BY 1, 2, 3, 4, 5;
"#,
    ),
    (
        33,
        r#"
-- An operator's hold on a run (its document holds who and why): when it began, for listings and
-- counts. A held run's ready workflow and activity tasks are written 'paused'; their deadlines
-- still run, so the deadline index covers them.
ALTER TABLE runs ADD COLUMN paused_at INTEGER;
DROP INDEX tasks_deadline;
CREATE INDEX tasks_deadline ON tasks (deadline_at) WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased', 'paused');
"#,
    ),
    (
        34,
        r#"
-- Batch operations (docs/batch-operations.md): an action applied to every current run a query
-- selects, a step at a time under a duty fence; request and progress are the app's JSON.
CREATE TABLE batch_operations (
    batch_id        TEXT PRIMARY KEY,
    namespace       TEXT NOT NULL,
    action          TEXT NOT NULL,
    request         TEXT NOT NULL,
    state           TEXT NOT NULL,
    progress        TEXT NOT NULL,
    principal       TEXT,
    request_id      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    next_step_at    INTEGER NOT NULL,
    duty_owner      TEXT,
    duty_fence      INTEGER NOT NULL,
    duty_expires_at INTEGER
);
CREATE UNIQUE INDEX batch_operations_request ON batch_operations (namespace, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX batch_operations_listed ON batch_operations (namespace, created_at);
CREATE INDEX batch_operations_due ON batch_operations (next_step_at) WHERE state = 'running';
"#,
    ),
    (
        35,
        r#"
-- A removed instance's tasks are found by their run (retention, a delete batch), not by a scan
-- of every task (MySQL has had this index from the start).
CREATE INDEX tasks_by_run ON tasks (run_id);
"#,
    ),
    (
        36,
        r#"
-- History as a rowid table with its key in an index. Clustered by (run_id, sequence), the events
-- of the runs in flight arrived interleaved and split pages half full for good (46% used at
-- 100,000 closed runs); appended by rowid, pages fill. The copy is in run order. The key's index
-- is named as PostgreSQL names a primary key's.
CREATE TABLE history_events_appended (
    run_id              TEXT NOT NULL,
    sequence            INTEGER NOT NULL,
    event_id            TEXT NOT NULL,
    event_type          TEXT NOT NULL,
    payload             TEXT NOT NULL,
    workflow_task_id    TEXT,
    workflow_command_id TEXT,
    recorded_at         INTEGER NOT NULL,
    prev_hash           TEXT NOT NULL,
    hash                TEXT NOT NULL
);
INSERT INTO history_events_appended (run_id, sequence, event_id, event_type, payload, workflow_task_id,
    workflow_command_id, recorded_at, prev_hash, hash)
SELECT run_id, sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at,
    prev_hash, hash
FROM history_events ORDER BY run_id, sequence;
DROP TABLE history_events;
ALTER TABLE history_events_appended RENAME TO history_events;
CREATE UNIQUE INDEX history_events_pkey ON history_events (run_id, sequence);
"#,
    ),
    (
        37,
        r#"
-- Whether a run is its instance's current run, kept by the transaction that makes a successor
-- current. A listing keeps current runs by a column of the row it reads already: a lookup of
-- the instance per run left PostgreSQL's planner guessing, and it sorted every run for a page.
ALTER TABLE runs ADD COLUMN is_current INTEGER NOT NULL DEFAULT 1;
UPDATE runs SET is_current = 0 WHERE run_id IN (
    SELECT r.run_id FROM runs r JOIN workflow_instances i ON i.workflow_id = r.workflow_id WHERE i.current_run_id <> r.run_id);
"#,
    ),
];

/// Applies every migration not yet recorded, each in its own transaction, after checking that
/// this binary may run against the database at all (`schema_floor`).
pub fn migrate(conn: &mut Connection, now: i64) -> crate::StoreResult<()> {
    use crate::schema_floor;
    use rusqlite::OptionalExtension;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")?;
    conn.execute_batch(schema_floor::CREATE_FLOOR_TABLE)?;
    let database: Option<i64> = conn.query_row("SELECT MAX(version) FROM schema_migrations", [], |r| r.get(0))?;
    let floor: Option<i64> = conn.query_row(schema_floor::READ_FLOOR, [], |r| r.get(0)).optional()?;
    let known = MIGRATIONS.last().map_or(0, |(version, _)| *version);
    schema_floor::admit(known, database, floor)?;
    for (version, sql) in MIGRATIONS {
        let applied: bool = conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if applied {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            [*version, now],
        )?;
        tx.commit()?;
    }
    conn.execute(
        "INSERT INTO schema_floor (id, floor) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET floor = MAX(floor, excluded.floor)",
        [schema_floor::schema_floor(crate::tx::Dialect::Sqlite)],
    )?;
    conn.execute(
        "INSERT OR IGNORE INTO namespaces (name, description, created_at) VALUES ('default', 'Default namespace', ?1)",
        [now],
    )?;
    Ok(())
}
