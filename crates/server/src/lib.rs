#![recursion_limit = "256"]
//! Capstan's HTTP server: the DW v2 wire protocol in front of the engine and a store.
//!
//! Handlers only translate: wire JSON in → engine types → a store call → wire JSON out. The
//! server also owns the long-poll wake-up hub and the background clock that fires timers and
//! expires leases. It is a library: `capstan serve` is a thin shell around [`serve`].

pub mod admission;
mod atomic;
pub mod auth;
mod avro;
mod batch_runner;
mod body;
mod canonical;
mod clock;
pub mod error;
pub mod fuzzing;
mod history_cache;
mod history_export;
mod housekeeping;
mod hub;
pub mod integrity;
mod long_poll;
pub mod metrics;
mod offload;
mod page_token;
mod payload_storage;
mod planes;
mod render;
mod routes;
mod scheduler;
pub mod telemetry;
pub mod tls;
mod ui;
mod wait;
mod wire;

use axum::Router;
use capstan_engine::Limits;
use capstan_store::Store;
use std::net::SocketAddr;
use std::sync::Arc;

pub use auth::{AuthConfig, Role};
pub use avro::{empty_arguments_blob, null_blob};
pub use wire::history_bundle::checksum as history_bundle_checksum;

/// The Avro envelope of a JSON value list as workflow or signal arguments (for clients such as
/// the CLI that take JSON from people).
pub fn arguments_envelope(arguments: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({"codec": "avro", "blob": avro::encode_json(&serde_json::Value::Array(arguments.to_vec()))})
}

/// An Avro payload envelope (`{"codec", "blob"}`) decoded to JSON, if it is one Capstan reads.
pub fn decode_envelope(envelope: &serde_json::Value) -> Option<serde_json::Value> {
    use capstan_engine::MemoCodec;
    let blob = envelope.get("blob")?.as_str()?;
    let codec = envelope
        .get("codec")
        .and_then(|c| c.as_str())
        .unwrap_or(capstan_engine::payload::AVRO_CODEC);
    avro::AVRO_MEMO.to_json(&capstan_engine::Payload::inline(codec, blob)).ok()
}
pub use capstan_store::{AtomicAction, AtomicActions, AtomicTransaction, STACK_BYTES};

/// Worker protocol version advertised; requests may use `1.0` … this.
pub const WORKER_PROTOCOL_VERSION: &str = "1.20";
pub const WORKER_PROTOCOL_MINOR: u32 = 20;
/// Control-plane version accepted (exactly).
pub const CONTROL_PLANE_VERSION: &str = "2";

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub auth: AuthConfig,
    /// Workflow task lease length.
    pub workflow_task_lease_ms: i64,
    /// Activity attempt lease length (extended by heartbeats).
    pub activity_task_lease_ms: i64,
    /// How long a claimed background duty stays this node's before another may take it over.
    pub duty_lease_ms: i64,
    /// How long a query waits for a worker's answer before 504.
    pub query_wait_ms: i64,
    /// Longest long-poll hold, whatever the client asks.
    pub poll_wait_max_ms: i64,
    pub limits: Limits,
    /// This node's id: shown as `server_id` in cluster info, and the owner of the background
    /// duties it claims. Unique per process.
    pub server_id: String,
    /// Handlers of `atomic` actions, by activity type, registered by an embedding application
    /// (empty for `capstan serve`).
    pub atomic_actions: AtomicActions,
    /// Schedule occurrences missed (server down) within this window still fire, one by one;
    /// older ones are skipped and counted.
    pub schedule_catchup_window_ms: i64,
    /// Where time and new ids come from (the store is given the same).
    pub sources: capstan_store::Sources,
    /// Bytes of rendered history events kept in memory for worker history pages.
    pub history_cache_bytes: usize,
    /// The server's own spans (OTLP), when configured.
    pub telemetry: telemetry::Telemetry,
    /// The external payload transport: its limits and where `local` storage defaults to.
    pub payloads: capstan_app::external_payloads::PayloadSettings,
    /// Task queue limits the configuration sets, applied at start.
    pub queue_limits: Vec<capstan_app::queue_limits::ConfiguredLimit>,
    /// Serve over TLS with these certificates (loaded at start, reloaded when their files
    /// change), else plain HTTP.
    pub tls: Option<std::sync::Arc<tls::Certificates>>,
    /// What the configuration lets start but an operator must know (a listener reachable from
    /// the network without TLS…), shown on `GET /api/cluster/info` under `diagnostics`.
    pub diagnostics: Vec<Diagnostic>,
    /// Series of components beside the server (the continuous replica), read at each scrape.
    pub reporters: Vec<std::sync::Arc<dyn metrics::Reporter>>,
    /// When requests are refused rather than queued (`admission`).
    pub admission: admission::AdmissionSettings,
}

/// One warning about how the server was configured.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub code: String,
    pub message: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            auth: AuthConfig::None,
            workflow_task_lease_ms: 60_000,
            activity_task_lease_ms: 300_000,
            duty_lease_ms: 30_000,
            query_wait_ms: 30_000,
            poll_wait_max_ms: 60_000,
            limits: Limits::default(),
            server_id: format!("capstan-{}", capstan_store::Sources::system().new_ulid()),
            atomic_actions: AtomicActions::default(),
            schedule_catchup_window_ms: 60_000,
            sources: capstan_store::Sources::system(),
            history_cache_bytes: 32 << 20,
            telemetry: telemetry::Telemetry::default(),
            payloads: Default::default(),
            queue_limits: Vec::new(),
            tls: None,
            diagnostics: Vec::new(),
            reporters: Vec::new(),
            admission: admission::AdmissionSettings::default(),
        }
    }
}

/// Drain intents per (namespace, queue), with when they were read.
type RolloutCache = std::collections::HashMap<(String, String), (i64, Vec<capstan_store::BuildIdRollout>)>;

/// What every handler shares.
pub struct AppState<S: Store> {
    pub store: S,
    pub config: ServerConfig,
    hub: hub::WakeHub,
    query_answers: hub::KeyedWakeups,
    /// Readers waiting on a workflow output stream, by `{run_id}/{stream}`.
    stream_appends: hub::KeyedWakeups,
    poll_requests: hub::KeyedLocks,
    clock: clock::ClockAlarm,
    scheduler_kick: tokio::sync::Notify,
    /// Build-id drain intents per (namespace, queue), read at most once a second per queue.
    rollouts: std::sync::Mutex<RolloutCache>,
    /// The worker registrations this node last saw (`capstan_app::polls::poller`).
    registrations: capstan_app::polls::KnownRegistrations,
    /// The last `server_time` stamped on a reply, in microseconds.
    last_server_time_us: std::sync::atomic::AtomicI64,
    /// Rendered history events for worker history pages.
    pub(crate) history: history_cache::HistoryCache,
    /// Each namespace's object store, kept while its policy stays the same.
    pub(crate) payload_stores: payload_storage::StoreCache,
    /// Each namespace's offload threshold, briefly cached (read on large request bodies).
    pub(crate) offload_thresholds: offload::Thresholds,
    /// This process's counters and histograms (`/metrics`).
    pub metrics: Arc<metrics::Metrics>,
    /// The planes' in-flight limits (`admission`).
    pub(crate) admission: admission::Limits,
}

pub type Shared<S> = Arc<AppState<S>>;

/// How long a queue's build-id rollouts are served from memory.
const ROLLOUT_CACHE_MS: i64 = 1_000;

impl<S: Store> capstan_app::Services for AppState<S> {
    type Store = S;

    fn store(&self) -> &S {
        &self.store
    }

    fn sources(&self) -> &capstan_store::Sources {
        &self.config.sources
    }

    fn limits(&self) -> &Limits {
        &self.config.limits
    }

    fn known_registrations(&self) -> Option<&capstan_app::polls::KnownRegistrations> {
        Some(&self.registrations)
    }

    /// Drain intents change rarely and are read on every poll: read at most once a second per
    /// queue.
    async fn rollouts(&self, namespace: &str, queue: &str) -> capstan_store::StoreResult<Vec<capstan_store::BuildIdRollout>> {
        let key = (namespace.to_string(), queue.to_string());
        let now = self.now();
        if let Some((at, cached)) = self.rollouts.lock().expect("rollouts").get(&key) {
            if now - at < ROLLOUT_CACHE_MS {
                return Ok(cached.clone());
            }
        }
        let fresh = self.store.build_id_rollouts(namespace, queue).await?;
        self.rollouts.lock().expect("rollouts").insert(key, (now, fresh.clone()));
        Ok(fresh)
    }
}

impl<S: Store> AppState<S> {
    /// After a change to `run`: wake the clock if the run now has a deadline before the one the
    /// clock sleeps towards. (Runs changed by follow-on transitions, a child started or a parent
    /// told, are not seen here: a deadline of theirs that is under a second away waits at most
    /// the clock's one-second re-check.) Pollers are woken by the store's own announcements of
    /// tasks it made ready, sent after commit (`Store::wakeups`), which also cover tasks in other
    /// runs and on other nodes.
    pub(crate) fn run_changed(&self, run: &capstan_engine::RunState) {
        self.clock.run_changed(run);
    }

    /// The time now, from the configured clock (the only place the server reads the time).
    pub fn now(&self) -> capstan_engine::Millis {
        self.config.sources.now_ms()
    }

    /// A fresh id, from the configured id mint.
    pub fn new_id(&self) -> String {
        self.config.sources.new_id()
    }

    /// The `server_time` a worker reply carries, in microseconds: the clock's time, but strictly
    /// later than any stamp this process gave before. SDKs refuse a lease renewal whose
    /// `server_time` does not move forward, and two renewals can land in one millisecond.
    pub fn server_time_us(&self) -> i64 {
        use std::sync::atomic::Ordering;
        let now_us = self.now() * 1000;
        let previous = self
            .last_server_time_us
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| Some(now_us.max(last + 1)))
            .expect("the update always yields a value");
        now_us.max(previous + 1)
    }
}

/// Builds the application router for `store`.
pub fn app<S: Store>(store: S, config: ServerConfig) -> (Router, Shared<S>) {
    // Transitions that encode or decode payloads on their own (a reconciliation probe's
    // question and answer) use the codec the SDKs speak.
    let store = store.with_payload_codec(&avro::AVRO_MEMO);
    // Committed facts and commit times feed the metrics.
    let metrics = Arc::new(metrics::Metrics::new());
    let store = store.with_observer(metrics.clone());
    let history = history_cache::HistoryCache::new(config.history_cache_bytes);
    let state = Arc::new(AppState {
        store,
        config,
        history,
        hub: hub::WakeHub::default(),
        query_answers: hub::KeyedWakeups::default(),
        stream_appends: hub::KeyedWakeups::default(),
        poll_requests: hub::KeyedLocks::default(),
        clock: Default::default(),
        scheduler_kick: tokio::sync::Notify::new(),
        rollouts: Default::default(),
        registrations: Default::default(),
        last_server_time_us: Default::default(),
        payload_stores: Default::default(),
        offload_thresholds: Default::default(),
        metrics,
        admission: Default::default(),
    });
    (routes::router(state.clone()), state)
}

/// Serves until `shutdown` resolves, with the background clock running beside it.
pub async fn serve<S: Store>(
    listener: tokio::net::TcpListener,
    store: S,
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (router, state) = app(store, config);
    capstan_app::queue_limits::apply_configured(&*state, &state.config.queue_limits)
        .await
        .map_err(|e| std::io::Error::other(format!("task queue limits from the configuration: {e}")))?;
    let clock = tokio::spawn(clock::run(state.clone()));
    let batch_runner = tokio::spawn(batch_runner::run(state.clone()));
    let housekeeping = tokio::spawn(housekeeping::run(state.clone()));
    let scheduler = tokio::spawn(scheduler::run(state.clone()));
    let give_back = tokio::spawn(long_poll::give_back_undelivered(state.clone()));
    let executor = (!state.config.atomic_actions.is_empty()).then(|| tokio::spawn(atomic::run(state.clone())));
    let credentials = match state.config.auth.credentials().cloned() {
        Some(credentials) => {
            // Those managed over the API authenticate from the first request on.
            auth::load_managed_credentials(&credentials, &state.store)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            Some(tokio::spawn(auth::follow_credentials(credentials, state.clone())))
        }
        None => None,
    };
    // Other nodes sharing the database announce ready tasks; feed them to local pollers.
    if let Some(mut wakeups) = state.store.wakeups().await.map_err(|e| std::io::Error::other(e.to_string()))? {
        let hub = state.hub.clone();
        tokio::spawn(async move {
            while let Some((namespace, kind, queue)) = wakeups.recv().await {
                // One poller per announcement; it takes the work or hands the wake-up on.
                hub.wake_one(&namespace, kind, &queue);
            }
        });
    }
    let result = match state.config.tls.clone() {
        None => {
            axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(certificates) => {
            let follower = tokio::spawn(certificates.clone().follow());
            let served = tls::serve(listener, router, certificates, shutdown).await;
            follower.abort();
            served
        }
    };
    clock.abort();
    batch_runner.abort();
    housekeeping.abort();
    scheduler.abort();
    give_back.abort();
    for task in [executor, credentials].into_iter().flatten() {
        task.abort();
    }
    // Sends the spans still buffered (the exporter blocks on its own thread).
    let telemetry = state.config.telemetry.clone();
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    result
}
