//! Test harness: a real Capstan server on a loopback port, driven over HTTP with reqwest the way
//! the DW SDKs drive it. The `http_api` target runs it on SQLite in a temp dir; the
//! `http_api_postgres` target (the same tests, built again) on a scratch schema of the
//! PostgreSQL at `CAPSTAN_TEST_POSTGRES_URL`.

#![allow(dead_code)]

use capstan_server::{AuthConfig, ServerConfig};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const PROTOCOL_HEADER: &str = "X-Durable-Workflow-Protocol-Version";
pub const CONTROL_HEADER: &str = "X-Durable-Workflow-Control-Plane-Version";
/// Avro single-object encoding of the empty argument list.
pub const EMPTY_ARGS: &str = "wwHioz3/VYAiNwwA";
/// Avro single-object encoding of `null`.
pub const AVRO_NULL: &str = "wwHioz3/VYAiNwA=";
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A payload envelope.
pub fn env(blob: &str) -> Value {
    json!({"codec": "avro", "blob": blob})
}

/// A fresh id for poll_request_id and similar keys.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Role tokens for servers started with token auth.
pub struct Tokens;
impl Tokens {
    pub const SHARED: &'static str = "shared-secret";
    pub const WORKER: &'static str = "worker-secret";
    pub const OPERATOR: &'static str = "operator-secret";
    pub const ADMIN: &'static str = "admin-secret";

    pub fn config() -> AuthConfig {
        AuthConfig::Token {
            shared: Some(Self::SHARED.into()),
            worker: Some(Self::WORKER.into()),
            operator: Some(Self::OPERATOR.into()),
            admin: Some(Self::ADMIN.into()),
            credentials: Default::default(),
        }
    }
}

/// A response read completely: status, headers and the JSON body (`null` when empty).
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Resp {
    /// Asserts the status and returns the body.
    #[track_caller]
    pub fn ok(self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.body);
        self.body
    }

    /// Asserts a DW error: the status, the `reason`, and the error shape (`reason` + `message`).
    #[track_caller]
    pub fn err(self, status: u16, reason: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.body);
        assert_error_shape(&self.body);
        assert_eq!(self.body["reason"], reason, "unexpected reason; body: {}", self.body);
        self.body
    }

    /// Asserts a DW error with one of several acceptable reasons; returns the reason.
    #[track_caller]
    pub fn err_one_of(self, status: u16, reasons: &[&str]) -> String {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.body);
        assert_error_shape(&self.body);
        let reason = self.body["reason"].as_str().unwrap_or_default().to_string();
        assert!(
            reasons.contains(&reason.as_str()),
            "reason {reason:?} not in {reasons:?}; body: {}",
            self.body
        );
        reason
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    }
}

/// Every DW error body is an object with a non-empty string `reason` and `message`.
#[track_caller]
pub fn assert_error_shape(body: &Value) {
    assert!(body.is_object(), "error body is not an object: {body}");
    assert!(
        body["reason"].as_str().is_some_and(|s| !s.is_empty()),
        "error body lacks a reason: {body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|s| !s.is_empty()),
        "error body lacks a message: {body}"
    );
}

/// Sends and reads the response. No request in these tests may ever produce a 5xx.
pub async fn send(request: RequestBuilder) -> Resp {
    let response = send_allowing_gateway_timeout(request).await;
    assert!(
        response.status != StatusCode::GATEWAY_TIMEOUT,
        "server error 504: {}",
        response.body
    );
    response
}

/// Like [`send`], for the documented 504s: a worker did not answer a query or validation in time.
pub async fn send_allowing_gateway_timeout(request: RequestBuilder) -> Resp {
    let response = send_allowing_server_errors(request).await;
    assert!(
        !response.status.is_server_error() || response.status == StatusCode::GATEWAY_TIMEOUT,
        "server error {}: {}",
        response.status,
        response.body
    );
    response
}

/// Sends and reads the response, 5xx included: only the storage-fault tests expect one (503).
pub async fn send_allowing_server_errors(request: RequestBuilder) -> Resp {
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("response body");
    let plain_text = headers
        .get("content-type")
        .is_some_and(|v| v.to_str().is_ok_and(|v| v.starts_with("text/plain")));
    let body = if text.trim().is_empty() {
        Value::Null
    } else if plain_text {
        // `/metrics`: Prometheus text.
        Value::String(text)
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON body (status {status}): {e}: {text}"))
    };
    Resp { status, headers, body }
}

/// Polls `probe` until it yields a value, failing after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Whether this test target runs its servers on PostgreSQL.
/// The shared database this test target runs on (its name's suffix picks it), if any.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    Postgres,
    Mysql,
}

pub fn shared_database() -> Option<Shared> {
    let name = env!("CARGO_CRATE_NAME");
    if name.ends_with("_postgres") {
        Some(Shared::Postgres)
    } else if name.ends_with("_mysql") {
        Some(Shared::Mysql)
    } else {
        None
    }
}

fn postgres_url() -> String {
    std::env::var("CAPSTAN_TEST_POSTGRES_URL")
        .expect("CAPSTAN_TEST_POSTGRES_URL must name a PostgreSQL database (scripts/test-all.sh starts one)")
}

fn mysql_url() -> String {
    std::env::var("CAPSTAN_TEST_MYSQL_URL")
        .expect("CAPSTAN_TEST_MYSQL_URL must name a MariaDB or MySQL database (scripts/test-all.sh starts one)")
}

impl Shared {
    fn url(self) -> String {
        match self {
            Shared::Postgres => postgres_url(),
            Shared::Mysql => mysql_url(),
        }
    }
}

/// A connection to the MariaDB server itself (no database).
async fn mysql_admin() -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&mysql_url()).unwrap();
    mysql_async::Conn::new(mysql_async::OptsBuilder::from_opts(opts).db_name(None::<String>))
        .await
        .unwrap()
}

/// The server's store (shared with the test, for inspecting what was committed).
pub enum Backend {
    Sqlite(capstan_store::SqliteStore),
    Shared(Box<capstan_store::SharedStore>),
}

/// Drops a test's scratch schema (PostgreSQL) or database (MariaDB) when the test ends.
struct SchemaGuard(Shared, String);

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let (database, name) = (self.0, self.1.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                match database {
                    Shared::Postgres => {
                        let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await.ok()?;
                        tokio::spawn(connection);
                        client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await.ok()
                    }
                    Shared::Mysql => {
                        use mysql_async::prelude::Queryable;
                        let mut conn = mysql_admin().await;
                        conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`")).await.ok()?;
                        conn.disconnect().await.ok()
                    }
                }
            })
        })
        .join();
    }
}

/// A run's row lock held by a transaction outside the server.
pub enum RowHold {
    Postgres(tokio_postgres::Client),
    Mysql(mysql_async::Conn),
}

impl RowHold {
    /// Ends the holding transaction.
    pub async fn release(self) {
        match self {
            RowHold::Postgres(client) => client.batch_execute("COMMIT").await.unwrap(),
            RowHold::Mysql(mut conn) => {
                use mysql_async::prelude::Queryable;
                conn.query_drop("COMMIT").await.unwrap();
                conn.disconnect().await.unwrap();
            }
        }
    }
}

pub struct Harness {
    pub base: String,
    pub http: reqwest::Client,
    /// Bearer token sent by `worker()` / `client()`, if any.
    pub token: Option<String>,
    pub backend: Backend,
    _shutdown: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
    _schema: Option<SchemaGuard>,
}

impl Harness {
    pub async fn start() -> Self {
        Self::with_config(ServerConfig::default(), None).await
    }

    pub async fn with_config(config: ServerConfig, token: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local addr");
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stop.await;
        };
        let (backend, schema) = if let Some(database) = shared_database() {
            let schema = format!("h_{}", ulid::Ulid::new().to_string().to_lowercase());
            let store =
                capstan_store::SharedStore::connect_in_schema(&database.url(), &schema, config.limits.clone(), config.sources.now_ms())
                    .await
                    .expect("connect to the shared database");
            let served = store.clone();
            tokio::spawn(async move { capstan_server::serve(listener, served, config, stopped).await.expect("server runs") });
            (Backend::Shared(Box::new(store)), Some(SchemaGuard(database, schema)))
        } else {
            let path = dir.path().join("capstan.db");
            let store = capstan_store::SqliteStore::open(&path, config.limits.clone(), config.sources.now_ms()).expect("open store");
            let served = store.clone();
            tokio::spawn(async move { capstan_server::serve(listener, served, config, stopped).await.expect("server runs") });
            (Backend::Sqlite(store), None)
        };
        Self {
            base: format!("http://{address}"),
            http: reqwest::Client::new(),
            token: token.map(str::to_string),
            backend,
            _shutdown: shutdown,
            _dir: dir,
            _schema: schema,
        }
    }

    /// The server's store when it is SQLite (fault injection is SQLite's; PostgreSQL's storage
    /// faults are real ones, in tests/python/test_storage_faults.py).
    pub fn sqlite(&self) -> Option<&capstan_store::SqliteStore> {
        match &self.backend {
            Backend::Sqlite(store) => Some(store),
            Backend::Shared(_) => None,
        }
    }

    /// A second server (a node of its own: its own caches, credentials and clock loop) on this
    /// harness's database; it stops when the returned guard drops. Its base URL.
    pub async fn another_node(&self, config: ServerConfig) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local addr");
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stop.await;
        };
        match &self.backend {
            Backend::Sqlite(store) => {
                let served = store.clone();
                tokio::spawn(async move { capstan_server::serve(listener, served, config, stopped).await.expect("server runs") });
            }
            Backend::Shared(store) => {
                let served = store.as_ref().clone();
                tokio::spawn(async move { capstan_server::serve(listener, served, config, stopped).await.expect("server runs") });
            }
        }
        (format!("http://{address}"), shutdown)
    }

    /// The offline verifier over the server's database, as `capstan verify` runs it.
    pub async fn verify_offline(&self) -> capstan_server::integrity::IntegrityReport {
        match &self.backend {
            Backend::Sqlite(store) => capstan_server::integrity::verify(store).await.expect("verify"),
            Backend::Shared(store) => capstan_server::integrity::verify(store.as_ref()).await.expect("verify"),
        }
    }

    /// Overwrites a run's stored document behind the server's back.
    pub async fn tamper_run_document(&self, run_id: &str, document: &str) {
        match &self._schema {
            None => {
                let conn = rusqlite::Connection::open(self._dir.path().join("capstan.db")).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                conn.execute("UPDATE runs SET state = ?1 WHERE run_id = ?2", [document, run_id])
                    .unwrap();
            }
            Some(SchemaGuard(Shared::Postgres, schema)) => {
                let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                let sql = format!("UPDATE {schema}.runs SET state = $1 WHERE run_id = $2");
                client.execute(&sql, &[&document, &run_id]).await.unwrap();
            }
            Some(SchemaGuard(Shared::Mysql, database)) => {
                use mysql_async::prelude::Queryable;
                let mut conn = mysql_admin().await;
                let sql = format!("UPDATE `{database}`.runs SET state = ? WHERE run_id = ?");
                conn.exec_drop(sql, (document, run_id)).await.unwrap();
            }
        }
    }

    /// Takes the row lock of `run_id` in a transaction of its own, as a node paused inside a
    /// transaction holds it, until [`RowHold::release`]. Shared databases only (`None` on SQLite,
    /// whose writers never hold a row while another waits).
    pub async fn hold_run_row(&self, run_id: &str) -> Option<RowHold> {
        match &self._schema {
            None => None,
            Some(SchemaGuard(Shared::Postgres, schema)) => {
                let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                let sql = format!("BEGIN; SELECT 1 FROM {schema}.runs WHERE run_id = '{run_id}' FOR UPDATE");
                client.batch_execute(&sql).await.unwrap();
                Some(RowHold::Postgres(client))
            }
            Some(SchemaGuard(Shared::Mysql, database)) => {
                use mysql_async::prelude::Queryable;
                let mut conn = mysql_admin().await;
                conn.query_drop("START TRANSACTION").await.unwrap();
                let sql = format!("SELECT 1 FROM `{database}`.runs WHERE run_id = ? FOR UPDATE");
                let rows: Vec<i64> = conn.exec(sql, (run_id,)).await.unwrap();
                assert_eq!(rows, [1], "the run's row is there to hold");
                Some(RowHold::Mysql(conn))
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request with no headers at all.
    pub fn bare(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, self.url(path))
    }

    fn authed(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.bare(method, path).header("Accept", "application/json");
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A worker-plane request: protocol 1.20, namespace `default`.
    pub fn worker(&self, method: Method, path: &str) -> RequestBuilder {
        self.authed(method, path)
            .header(PROTOCOL_HEADER, "1.20")
            .header("X-Namespace", "default")
    }

    /// A control-plane request: version 2, namespace `default`.
    pub fn client(&self, method: Method, path: &str) -> RequestBuilder {
        self.authed(method, path)
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "default")
    }

    pub async fn wpost(&self, path: &str, body: Value) -> Resp {
        send(self.worker(Method::POST, path).json(&body)).await
    }

    pub async fn cget(&self, path: &str) -> Resp {
        send(self.client(Method::GET, path)).await
    }

    pub async fn cpost(&self, path: &str, body: Value) -> Resp {
        send(self.client(Method::POST, path).json(&body)).await
    }

    pub async fn cpost_method(&self, method: Method, path: &str, body: Value) -> Resp {
        send(self.client(method, path).json(&body)).await
    }

    // --------------------------------------------------------------------------------------
    // Worker plane

    pub async fn register(&self, worker_id: &str, queue: &str) -> Value {
        self.wpost(
            "/api/worker/register",
            json!({"worker_id": worker_id, "task_queue": queue, "runtime": "rust",
                   "sdk_version": "capstan-http-tests/1", "supported_workflow_types": [],
                   "supported_activity_types": []}),
        )
        .await
        .ok(201)
    }

    pub async fn poll_workflow_with(&self, body: Value) -> Resp {
        self.wpost("/api/worker/workflow-tasks/poll", body).await
    }

    /// One workflow poll; returns `task` (possibly `null`).
    pub async fn poll_workflow(&self, worker_id: &str, queue: &str, timeout_seconds: u64) -> Value {
        let body = self
            .poll_workflow_with(json!({"worker_id": worker_id, "task_queue": queue,
                "poll_request_id": unique("wf-poll"), "timeout_seconds": timeout_seconds,
                "history_page_size": 500}))
            .await
            .ok(200);
        body["task"].clone()
    }

    /// Polls until a workflow task arrives (long poll of up to 5 s).
    pub async fn next_workflow_task(&self, worker_id: &str, queue: &str) -> Value {
        let task = self.poll_workflow(worker_id, queue, 5).await;
        assert!(task.is_object(), "expected a workflow task, got {task}");
        task
    }

    pub async fn poll_activity(&self, worker_id: &str, queue: &str, timeout_seconds: u64) -> Value {
        let body = self
            .wpost(
                "/api/worker/activity-tasks/poll",
                json!({"worker_id": worker_id, "task_queue": queue,
                       "poll_request_id": unique("activity-poll"), "timeout_seconds": timeout_seconds}),
            )
            .await
            .ok(200);
        body["task"].clone()
    }

    pub async fn next_activity_task(&self, worker_id: &str, queue: &str) -> Value {
        let task = self.poll_activity(worker_id, queue, 5).await;
        assert!(task.is_object(), "expected an activity task, got {task}");
        task
    }

    /// Completes a polled workflow task with its own lease owner and attempt.
    pub async fn complete_workflow_task(&self, task: &Value, commands: Value) -> Resp {
        self.wpost(
            &format!("/api/worker/workflow-tasks/{}/complete", task["task_id"].as_str().expect("task_id")),
            json!({"lease_owner": task["lease_owner"], "workflow_task_attempt": task["workflow_task_attempt"],
                   "commands": commands}),
        )
        .await
    }

    pub async fn complete_activity(&self, task: &Value, blob: &str) -> Resp {
        self.wpost(
            &format!("/api/worker/activity-tasks/{}/complete", task["task_id"].as_str().expect("task_id")),
            json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"],
                   "result": env(blob)}),
        )
        .await
    }

    pub async fn fail_activity(&self, task: &Value, message: &str) -> Resp {
        self.wpost(
            &format!("/api/worker/activity-tasks/{}/fail", task["task_id"].as_str().expect("task_id")),
            json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"],
                   "failure": {"message": message, "type": "RuntimeError", "class": "builtins.RuntimeError",
                               "stack_trace": "trace", "non_retryable": false}}),
        )
        .await
    }

    pub async fn heartbeat_activity(&self, task: &Value) -> Resp {
        self.wpost(
            &format!(
                "/api/worker/activity-tasks/{}/heartbeat",
                task["task_id"].as_str().expect("task_id")
            ),
            json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"],
                   "details": {"progress": 1}}),
        )
        .await
    }

    // --------------------------------------------------------------------------------------
    // Control plane

    pub async fn start_workflow_with(&self, body: Value) -> Resp {
        self.cpost("/api/workflows", body).await
    }

    /// Starts `workflow_id` (type `test.workflow`) on `queue`; returns the 201 body.
    pub async fn start_workflow(&self, workflow_id: &str, queue: &str) -> Value {
        self.start_workflow_with(json!({"workflow_id": workflow_id, "workflow_type": "test.workflow",
            "task_queue": queue, "input": env(EMPTY_ARGS), "execution_timeout_seconds": 3600,
            "run_timeout_seconds": 600}))
            .await
            .ok(201)
    }

    pub async fn describe(&self, workflow_id: &str) -> Value {
        self.cget(&format!("/api/workflows/{workflow_id}")).await.ok(200)
    }

    /// The whole control-plane history of a run.
    pub async fn history(&self, workflow_id: &str, run_id: &str) -> Vec<Value> {
        self.history_from(workflow_id, run_id, GENESIS_HASH).await
    }

    /// The history of a run whose chain continues another's (`origin`: that run's last hash).
    pub async fn history_from(&self, workflow_id: &str, run_id: &str, origin: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/api/workflows/{workflow_id}/runs/{run_id}/history?page_size=1000");
            if let Some(token) = &token {
                path.push_str(&format!("&next_page_token={}", urlencode(token)));
            }
            let page = self.cget(&path).await.ok(200);
            events.extend(page["events"].as_array().expect("events list").iter().cloned());
            match page["next_page_token"].as_str() {
                Some(next) if !next.is_empty() => token = Some(next.to_string()),
                _ => break,
            }
        }
        assert_hash_chain_from(&events, origin);
        events
    }

    /// Sets up a run with one leased workflow task: registers `worker`, starts, polls.
    pub async fn started_and_leased(&self, workflow_id: &str, worker: &str, queue: &str) -> (Value, Value) {
        self.register(worker, queue).await;
        let start = self.start_workflow(workflow_id, queue).await;
        let task = self.next_workflow_task(worker, queue).await;
        assert_eq!(task["workflow_id"], workflow_id);
        (start, task)
    }
}

/// Percent-encodes every byte outside the unreserved set (as Python's `quote(safe="")` does).
pub fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn event_types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event_type"].as_str().expect("event_type").to_string())
        .collect()
}

pub fn count_events(events: &[Value], event_type: &str) -> usize {
    events.iter().filter(|e| e["event_type"] == event_type).count()
}

/// Sequences contiguous from 1; `prev_hash` of the first is the genesis hash and each next
/// `prev_hash` is the previous `hash`; hashes are 64 lowercase hex digits.
#[track_caller]
pub fn assert_hash_chain(events: &[Value]) {
    assert_hash_chain_from(events, GENESIS_HASH)
}

pub fn assert_hash_chain_from(events: &[Value], origin: &str) {
    let mut previous = origin.to_string();
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["sequence"], (index + 1) as u64, "sequence gap at {index}: {event}");
        let prev = event["prev_hash"]
            .as_str()
            .unwrap_or_else(|| panic!("event without prev_hash: {event}"));
        let hash = event["hash"].as_str().unwrap_or_else(|| panic!("event without hash: {event}"));
        assert_eq!(prev, previous, "hash chain broken at sequence {}", index + 1);
        assert!(
            hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "hash is not 64 hex digits: {hash}"
        );
        assert_ne!(hash, prev, "hash equals prev_hash at sequence {}", index + 1);
        previous = hash.to_string();
    }
}

pub fn schedule_activity(activity_type: &str, queue: &str) -> Value {
    json!({"type": "schedule_activity", "activity_type": activity_type, "queue": queue,
           "arguments": env(EMPTY_ARGS), "start_to_close_timeout": 30})
}

pub fn complete_workflow(blob: &str) -> Value {
    json!({"type": "complete_workflow", "result": env(blob)})
}

/// The checks the Python SDK 2.12.0 makes on `/api/cluster/info` before a worker may start
/// (protocol reference 01-cluster-info.md), for a worker requesting protocol `1.<minor>`.
#[track_caller]
pub fn assert_python_sdk_accepts_cluster_info(info: &Value, minor: u32) {
    assert!(info.is_object(), "cluster info must be an object");
    let control = &info["control_plane"];
    assert!(control.is_object(), "control_plane must be an object");
    let version = match &control["version"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("control_plane.version must be a string or int, got {other}"),
    };
    assert_eq!(version, "2");
    let contract = &control["request_contract"];
    assert!(contract.is_object());
    assert_eq!(contract["schema"], "durable-workflow.v2.control-plane-request.contract");
    assert!(contract["version"] == json!(1) || contract["version"] == json!("1"));

    let worker_protocol = &info["worker_protocol"];
    assert!(worker_protocol.is_object(), "worker_protocol must be an object");
    let advertised = worker_protocol["version"].as_str().expect("worker_protocol.version string");
    let (major, advertised_minor) = advertised.split_once('.').expect("MAJOR.MINOR");
    assert_eq!(major, "1");
    assert!(advertised_minor.parse::<u32>().expect("numeric minor") >= minor);
    let capabilities = &worker_protocol["server_capabilities"];
    assert!(capabilities.is_object());
    assert!(capabilities["query_tasks"].is_boolean());
    assert!(capabilities["supported_workflow_task_commands"]
        .as_array()
        .expect("command list")
        .iter()
        .all(Value::is_string));
    // Fenced deregistration: when advertised, the exact contract the Python worker validates
    // (anything else stops it from starting).
    if let Some(fencing) = capabilities.get("worker_deregistration_fencing").filter(|f| f["supported"] == true) {
        assert_eq!(fencing["schema"], "durable-workflow.v2.worker-deregistration.v1");
        assert_eq!(fencing["endpoint"], "/worker/registrations/{workerId}/deregister");
        assert!(fencing["receipt_retention_seconds"].as_i64().is_some_and(|s| s > 0));
    }
    // Sticky execution and query-task authority are objects / booleans the SDKs test exactly.
    assert_eq!(capabilities["sticky_execution"]["supported"], true);
    assert_eq!(capabilities["query_task_authority"], true);

    let auth = &info["auth_composition_contract"];
    assert!(auth.is_object());
    assert_eq!(auth["schema"], "durable-workflow.v2.auth-composition.contract");
    assert_eq!(auth["version"], json!(1));
    for key in ["connection_values", "profile_selection"] {
        let list = auth["precedence"][key]
            .as_array()
            .unwrap_or_else(|| panic!("precedence.{key} list"));
        assert!(list.iter().all(Value::is_string));
    }
    let environment = auth["canonical_environment"].as_object().expect("canonical_environment object");
    assert!(environment.values().all(Value::is_string));
    for (key, value) in [
        ("server_url", "DURABLE_WORKFLOW_SERVER_URL"),
        ("namespace", "DURABLE_WORKFLOW_NAMESPACE"),
        ("auth_token", "DURABLE_WORKFLOW_AUTH_TOKEN"),
        ("tls_verify", "DURABLE_WORKFLOW_TLS_VERIFY"),
        ("profile", "DW_ENV"),
    ] {
        assert_eq!(environment[key], value, "canonical_environment.{key}");
    }
    let material = auth["auth_material"].as_object().expect("auth_material object");
    assert!(material.values().all(Value::is_object));
    assert_eq!(material["token"]["status"], "supported");
    assert_eq!(material["token"]["effective_config_value"], "redacted");
    assert_eq!(material["mtls"]["status"], "reserved");
    assert_eq!(material["signed_headers"]["status"], "reserved");
    let required = auth["effective_config"]["required_fields"].as_array().expect("required_fields");
    for field in ["server_url", "namespace", "profile", "auth", "tls", "identity"] {
        assert!(required.contains(&json!(field)), "required_fields lacks {field}");
    }
    let never_echo = auth["redaction"]["never_echo"].as_array().expect("never_echo");
    for field in ["bearer_tokens", "private_keys", "raw_authorization_headers"] {
        assert!(never_echo.contains(&json!(field)), "never_echo lacks {field}");
    }
    let max_payload = info["limits"]["max_payload_bytes"].as_u64().expect("limits.max_payload_bytes");
    assert!(max_payload > 0);
}
