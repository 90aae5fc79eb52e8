//! Test harness for driving a spawned `capstan serve` with the published
//! `durable-workflow` Rust SDK.
//!
//! * [`CapstanServer`] starts one server per test on a free loopback port with
//!   its own temporary data directory, waits for `GET /api/health` to answer
//!   200, and kills the process when dropped (printing the server log if the
//!   test is panicking).
//! * [`RunningWorker`] runs an SDK [`Worker`] in a background task and stops
//!   it cleanly; a clean stop means the SDK's own shutdown path, including
//!   `DELETE /api/worker/registrations/{id}`, returned `Ok(())`.
//! * [`within`] bounds every awaited operation so no test can hang.

#![allow(dead_code)]

use std::{
    fs::File,
    future::Future,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use durable_workflow::{Client, Value, Worker, WorkflowHandle, WorkflowResultOptions};
use tokio::{sync::oneshot, task::JoinHandle};

/// Upper bound for the server to answer its health check after spawn.
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);
/// Worker long-poll wait. Short, so that a stop request (which lets in-flight
/// long polls finish) completes quickly.
pub const WORKER_POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// Upper bound for a worker to finish its shutdown (drain polls + deregister).
const WORKER_STOP_DEADLINE: Duration = Duration::from_secs(30);
/// Default bound for single control-plane calls.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Default bound for waiting on a workflow result.
pub const RESULT_TIMEOUT: Duration = Duration::from_secs(45);

/// Await `future`, panicking with `what` if it does not finish within `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {limit:?} waiting for: {what}"),
    }
}

/// A process-unique, time-salted identifier with the given prefix.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}-{}-{nanos:x}-{n}", std::process::id())
}

fn capstan_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CAPSTAN_BIN") {
        return PathBuf::from(path);
    }
    // Integration-test executables live in <target>/<profile>/deps/, the server
    // binary in <target>/<profile>/. This follows CARGO_TARGET_DIR overrides.
    if let Ok(exe) = std::env::current_exe() {
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            let candidate = profile_dir.join(format!("capstan{}", std::env::consts::EXE_SUFFIX));
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/debug")
        .join(format!("capstan{}", std::env::consts::EXE_SUFFIX))
}

fn spawn_serve(binary: &Path, serve_args: &[String], log: File) -> Child {
    let log_err = log.try_clone().expect("clone server log handle");
    Command::new(binary)
        .arg("serve")
        .args(serve_args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn()
        .unwrap_or_else(|error| panic!("spawn {}: {error}", binary.display()))
}

/// A CA and a certificate for 127.0.0.1 and localhost it signed, made by openssl in `dir`:
/// the CA's, the certificate's and the key's paths.
pub fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let done = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(done.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&done.stderr));
    };
    let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    openssl(
        &[
            &["req", "-x509"][..],
            &curve,
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=e2e-ca"],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &curve,
            &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the extensions");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// The client that probes `GET /api/health` (trusting `tls_ca_pem` when the server serves TLS).
fn health_client(tls_ca_pem: Option<&[u8]>) -> reqwest::Client {
    let mut http = reqwest::Client::builder().timeout(Duration::from_secs(2));
    if let Some(pem) = tls_ca_pem {
        http = http.add_root_certificate(reqwest::Certificate::from_pem(pem).expect("a PEM CA"));
    }
    http.build().expect("build health-check HTTP client")
}

fn free_loopback_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    listener.local_addr().expect("read the ephemeral port").port()
}

/// One spawned `capstan serve` process, killed on drop.
pub struct CapstanServer {
    child: Child,
    base_url: String,
    log_path: PathBuf,
    /// What `restart` runs again: the `capstan serve` arguments after the subcommand.
    serve_args: Vec<String>,
    /// The CA that signed the server's certificate, when it serves TLS.
    tls_ca_pem: Option<Vec<u8>>,
    // Held for its Drop: removes the data directory and log after the process is gone.
    _root: tempfile::TempDir,
    /// The TLS certificates' directory, for a server serving TLS (held like `_root`).
    _certificates: Option<tempfile::TempDir>,
}

impl CapstanServer {
    /// Spawn a server on a free port and wait until `GET /api/health` is 200.
    pub async fn spawn() -> Self {
        Self::spawn_with(&[]).await
    }

    /// [`CapstanServer::spawn`] with extra `capstan serve` arguments.
    pub async fn spawn_with(extra_args: &[&str]) -> Self {
        Self::spawn_serving(extra_args, None).await
    }

    /// A server serving TLS (`--tls-cert`, `--tls-key`) with a certificate for 127.0.0.1 that
    /// its own CA signed (made by openssl); [`CapstanServer::client`] trusts that CA.
    pub async fn spawn_tls() -> Self {
        let certificates = tempfile::Builder::new().prefix("capstan-tls-").tempdir().expect("a directory");
        let (ca, cert, key) = make_certificates(certificates.path());
        let cert = cert.to_string_lossy().into_owned();
        let key = key.to_string_lossy().into_owned();
        let ca_pem = std::fs::read(ca).expect("read the CA");
        let mut server = Self::spawn_serving(&["--tls-cert", &cert, "--tls-key", &key], Some(ca_pem)).await;
        // The server watches the files for rotation: they stay as long as it runs.
        server._certificates = Some(certificates);
        server
    }

    async fn spawn_serving(extra_args: &[&str], tls_ca_pem: Option<Vec<u8>>) -> Self {
        let binary = capstan_binary();
        assert!(
            binary.is_file(),
            "capstan binary not found at {} (build it with `cargo build -p capstan` or set CAPSTAN_BIN)",
            binary.display()
        );

        let http = health_client(tls_ca_pem.as_deref());
        let scheme = if tls_ca_pem.is_some() { "https" } else { "http" };

        // The port is released before the server binds it, so another process
        // may take it in between; retry with a fresh port if the server exits.
        let mut last_failure = String::new();
        for _ in 0..3 {
            let root = tempfile::Builder::new()
                .prefix("capstan-sdk-e2e-")
                .tempdir()
                .expect("create temporary directory");
            let data_dir = root.path().join("data");
            std::fs::create_dir_all(&data_dir).expect("create data directory");
            let log_path = root.path().join("capstan.log");
            let log = File::create(&log_path).expect("create server log file");

            let port = free_loopback_port();
            let listen = format!("127.0.0.1:{port}");
            let mut serve_args = vec!["--listen".to_string(), listen.clone(), "--data-dir".to_string()];
            serve_args.push(data_dir.to_string_lossy().into_owned());
            serve_args.extend(extra_args.iter().map(|a| a.to_string()));
            let child = spawn_serve(&binary, &serve_args, log);

            let mut server = CapstanServer {
                child,
                base_url: format!("{scheme}://{listen}"),
                log_path,
                serve_args,
                tls_ca_pem: tls_ca_pem.clone(),
                _root: root,
                _certificates: None,
            };
            match server.wait_until_healthy(&http).await {
                Ok(()) => return server,
                Err(failure) => {
                    last_failure = failure;
                    // Drop kills the process; do not treat this as a test panic.
                    server.kill();
                }
            }
        }
        panic!("capstan server did not become healthy: {last_failure}");
    }

    /// Kills the server (SIGKILL: no shutdown of any kind) and starts it again on the same
    /// port and data directory, waiting until it is healthy.
    pub async fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .expect("reopen server log");
        self.child = spawn_serve(&capstan_binary(), &self.serve_args, log);
        let http = health_client(self.tls_ca_pem.as_deref());
        if let Err(failure) = self.wait_until_healthy(&http).await {
            panic!("capstan did not come back after a restart: {failure}");
        }
    }

    async fn wait_until_healthy(&mut self, http: &reqwest::Client) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let url = format!("{}/api/health", self.base_url);
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "server exited with {status} before becoming healthy; log:\n{}",
                    self.log_tail()
                ));
            }
            let last = match http.get(&url).send().await {
                Ok(response) if response.status() == reqwest::StatusCode::OK => return Ok(()),
                Ok(response) => format!("GET /api/health -> {}", response.status()),
                Err(error) => format!("GET /api/health failed: {error}"),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "no 200 from {url} within {STARTUP_DEADLINE:?} (last: {last}); log:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Server origin, without the SDK-owned `/api` suffix.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// An SDK client for namespace `default`, without credentials (trusting the server's CA,
    /// by the SDK's own option, when it serves TLS).
    pub fn client(&self) -> Client {
        let mut builder = Client::builder(self.base_url.clone())
            .namespace("default")
            .timeout(Duration::from_secs(60));
        if let Some(pem) = &self.tls_ca_pem {
            builder = builder.additional_root_certificates_pem(pem).expect("a PEM CA");
        }
        builder.build().expect("build durable-workflow client")
    }

    /// The last part of the server's combined stdout/stderr.
    pub fn log_tail(&self) -> String {
        const MAX: usize = 16 * 1024;
        match std::fs::read(&self.log_path) {
            Ok(bytes) => {
                let start = bytes.len().saturating_sub(MAX);
                String::from_utf8_lossy(&bytes[start..]).into_owned()
            }
            Err(error) => format!("<could not read {}: {error}>", self.log_path.display()),
        }
    }

    /// A control-plane `GET /api{path}` answer (the tests read fields the SDK does not surface).
    pub async fn control_get(&self, path: &str) -> Value {
        let url = format!("{}/api{path}", self.base_url);
        let response = reqwest::Client::new()
            .get(&url)
            .timeout(Duration::from_secs(10))
            .header("X-Durable-Workflow-Control-Plane-Version", "2")
            .header("X-Namespace", "default")
            .send()
            .await
            .unwrap_or_else(|error| panic!("GET {url}: {error}"));
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET {url} -> {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|error| panic!("GET {url} returned non-JSON ({error}): {body}"))
    }

    /// Control-plane `GET /api/workflows/{id}/runs/{run}/history`, following
    /// `next_page_token`, returning every event object.
    ///
    /// The SDK never reads control-plane history itself; the tests use it only
    /// to observe durable progress (for example that a signal wait is open).
    pub async fn history_events(&self, workflow_id: &str, run_id: &str) -> Vec<Value> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("build history HTTP client");
        let url = format!("{}/api/workflows/{workflow_id}/runs/{run_id}/history", self.base_url);
        let mut events = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..100 {
            let mut request = http
                .get(&url)
                .header("X-Durable-Workflow-Control-Plane-Version", "2")
                .header("X-Namespace", "default")
                .header("Accept", "application/json")
                .query(&[("page_size", "1000")]);
            if let Some(token) = &token {
                request = request.query(&[("next_page_token", token.as_str())]);
            }
            let response = request.send().await.unwrap_or_else(|error| panic!("GET {url}: {error}"));
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            assert!(status.is_success(), "GET {url} -> {status}: {body}");
            let page: Value = serde_json::from_str(&body).unwrap_or_else(|error| panic!("GET {url} returned non-JSON ({error}): {body}"));
            let page_events = page
                .get("events")
                .and_then(Value::as_array)
                .unwrap_or_else(|| panic!("GET {url}: response has no `events` array: {body}"));
            events.extend(page_events.iter().cloned());
            token = page
                .get("next_page_token")
                .and_then(Value::as_str)
                .filter(|token| !token.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return events;
            }
        }
        panic!("GET {url}: history pagination did not terminate");
    }

    /// Event type names of the run's history, in order.
    pub async fn history_event_types(&self, workflow_id: &str, run_id: &str) -> Vec<String> {
        self.history_events(workflow_id, run_id)
            .await
            .iter()
            .map(|event| {
                event
                    .get("event_type")
                    .or_else(|| event.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("<missing event_type>")
                    .to_string()
            })
            .collect()
    }

    /// Poll the run's history until it contains `event_type`, or panic after `limit`.
    pub async fn wait_for_history_event(&self, workflow_id: &str, run_id: &str, event_type: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let types = self.history_event_types(workflow_id, run_id).await;
            if types.iter().any(|t| t == event_type) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "history of {workflow_id}/{run_id} has no {event_type} after {limit:?}; events: {types:?}"
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // std's kill() sends SIGKILL on Unix.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for CapstanServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- capstan server log ({}) ----\n{}\n---- end of server log ----",
                self.base_url,
                self.log_tail()
            );
        }
    }
}

/// A new SDK worker with a unique id and a short long-poll wait.
pub fn new_worker(client: &Client, task_queue: &str) -> Worker {
    Worker::new(client.clone(), task_queue.to_string())
        .worker_id(unique("sdk-e2e-worker"))
        .poll_timeout(WORKER_POLL_TIMEOUT)
}

/// Result polling options used by the tests (the outer [`within`] is the hard bound).
pub fn result_options(timeout: Duration) -> WorkflowResultOptions {
    WorkflowResultOptions {
        poll_interval: Duration::from_millis(200),
        timeout,
    }
}

/// An SDK worker on a runtime of its own, so that it can be crashed: shutting the runtime
/// down drops every task the worker spawned (pollers, heartbeats, activities) mid-flight,
/// with nothing deregistered or closed. The server learns of it only from leases running out.
/// Give it a `Client` of its own: connections its runtime opened die with the runtime.
pub struct IsolatedWorker {
    runtime: Option<tokio::runtime::Runtime>,
}

impl IsolatedWorker {
    pub fn start(worker: Worker) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build the worker's runtime");
        runtime.spawn(async move { worker.run_until(std::future::pending::<()>()).await });
        Self { runtime: Some(runtime) }
    }

    pub fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for IsolatedWorker {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An SDK worker running `Worker::run_until` in a background task.
pub struct RunningWorker {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<durable_workflow::Result<()>>>,
}

impl RunningWorker {
    /// Start `worker.run_until(..)`; it registers itself, heartbeats and polls.
    pub fn start(worker: Worker) -> Self {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            worker
                .run_until(async move {
                    let _ = stop_rx.await;
                })
                .await
        });
        RunningWorker {
            stop: Some(stop_tx),
            join: Some(join),
        }
    }

    /// Await `handle.result(..)`, failing fast if the worker loop ends first.
    pub async fn result(&mut self, handle: &WorkflowHandle) -> durable_workflow::Result<Value> {
        self.result_within(handle, RESULT_TIMEOUT).await
    }

    pub async fn result_within(&mut self, handle: &WorkflowHandle, limit: Duration) -> durable_workflow::Result<Value> {
        let what = format!("result of workflow {}", handle.workflow_id);
        self.guard(limit, &what, handle.result(result_options(limit))).await
    }

    /// Await `future` (bounded by `limit`), panicking if the worker loop stops
    /// before it finishes: a dead worker would otherwise surface as a timeout.
    pub async fn guard<F: Future>(&mut self, limit: Duration, what: &str, future: F) -> F::Output {
        let join = self.join.as_mut().expect("worker has already been stopped");
        let bounded = tokio::time::timeout(limit + Duration::from_secs(5), future);
        tokio::pin!(bounded);
        tokio::select! {
            output = &mut bounded => match output {
                Ok(output) => output,
                Err(_) => panic!("timed out after {limit:?} waiting for: {what}"),
            },
            ended = join => {
                panic!("worker loop ended while waiting for {what}: {ended:?}");
            }
        }
    }

    /// Stop the worker and require a clean SDK shutdown (`Ok(())`), which
    /// includes a successful `DELETE /api/worker/registrations/{id}`.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let join = self.join.take().expect("worker has already been stopped");
        let outcome = within(WORKER_STOP_DEADLINE, "worker shutdown", join).await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("worker did not shut down cleanly: {error} ({error:?})"),
            Err(join_error) => panic!("worker task panicked or was cancelled: {join_error}"),
        }
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        // Only reached without `shutdown()` when a test is already failing.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(join) = self.join.take() {
            join.abort();
        }
    }
}
