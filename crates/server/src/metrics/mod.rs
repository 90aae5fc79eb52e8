//! The server's Prometheus metrics, served as text at `GET /metrics` (`docs/metrics.md` lists
//! every series).
//!
//! Two kinds of series. What this process did — requests, polls, dispatches, the facts its
//! store committed, commit times, schedule firings — is counted here for the process's life
//! (per node: Prometheus sums a cluster's nodes). What the database holds now — queue backlogs,
//! the recovery ledger, the connection pool — is read at each scrape (`scrape.rs`), so every
//! node reports the same figures for the shared database. Every label value comes from a
//! bounded set: routes from the route table, reasons from the catalogue, kinds and outcomes from
//! closed lists, namespaces from the operators; workflow types and queues, which clients name,
//! are capped (`LABEL_VALUES_MAX`, beyond it `_other`). Series with closed label sets exist at
//! zero from start-up (those of a namespace from the first scrape that sees it).

mod facts;
pub(crate) mod http;
mod scrape;

use capstan_engine::TaskKind;
use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

pub(crate) use scrape::render;

/// Most distinct values of a client-named label (workflow type per namespace, queue) one
/// family carries; later ones are counted under `_other`.
pub const LABEL_VALUES_MAX: usize = 500;
/// The label value standing for every value past the cap.
pub const OTHER: &str = "_other";

/// How a run ended, as `capstan_workflows_closed_total` labels it.
const CLOSE_REASONS: [&str; 6] = ["completed", "failed", "cancelled", "terminated", "timed_out", "continued"];
const TIMEOUT_KINDS: [&str; 5] = [
    "schedule_to_start",
    "start_to_close",
    "heartbeat",
    "schedule_to_close",
    "lease_expired",
];
/// What a poll can ask for.
pub const POLL_KINDS: [&str; 4] = ["workflow", "activity", "query", "update_validation"];
const LEASED_KINDS: [TaskKind; 2] = [TaskKind::Workflow, TaskKind::Activity];

const HTTP_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const POLL_SECONDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0];
const COMMIT_SECONDS: &[f64] = &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
const COMMIT_TRANSACTIONS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
const LATENESS_SECONDS: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0];

/// A registry that remembers each family's name, help and type, so a family without samples
/// yet is still declared in the text (Prometheus's encoder leaves empty families out).
pub(crate) struct Families {
    registry: Registry,
    declared: Vec<(String, String, &'static str)>,
}

impl Families {
    fn new() -> Self {
        Self {
            registry: Registry::new(),
            declared: Vec::new(),
        }
    }

    fn register<C: Collector + Clone + 'static>(&mut self, collector: C, name: &str, help: &str, kind: &'static str) -> C {
        self.declared.push((name.to_string(), help.to_string(), kind));
        self.registry
            .register(Box::new(collector.clone()))
            .unwrap_or_else(|e| panic!("metric {name} registers once: {e}"));
        collector
    }

    pub fn counters(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let vec = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter family");
        self.register(vec, name, help, "counter")
    }

    pub fn gauges(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let vec = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge family");
        self.register(vec, name, help, "gauge")
    }

    fn histograms(&mut self, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        let vec = HistogramVec::new(opts, labels).expect("a valid histogram family");
        self.register(vec, name, help, "histogram")
    }

    fn histogram(&mut self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let histogram = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid histogram");
        self.register(histogram, name, help, "histogram")
    }
}

/// A figure a component beside the server (the continuous replica) reports at each scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub name: &'static str,
    pub help: &'static str,
    /// A counter (only grows) rather than a gauge.
    pub counter: bool,
    pub value: i64,
}

/// What reports [`Reading`]s (`ServerConfig::reporters`); its series are process-wide.
pub trait Reporter: Send + Sync + std::fmt::Debug + 'static {
    fn readings(&self, now: capstan_engine::Millis) -> Vec<Reading>;
}

/// The counters and histograms of one server process.
pub struct Metrics {
    families: Families,
    pub(crate) http: http::HttpSeries,
    workflows_started: IntCounterVec,
    workflows_closed: IntCounterVec,
    polls: IntCounterVec,
    poll_seconds: HistogramVec,
    dispatches: IntCounterVec,
    throttled: IntCounterVec,
    lease_expiries: IntCounterVec,
    hand_offs: IntCounterVec,
    activity_timeouts: IntCounterVec,
    timers_fired: IntCounterVec,
    history_budget_crossings: IntCounterVec,
    commit_seconds: Histogram,
    commit_transactions: Histogram,
    schedule_starts: IntCounterVec,
    schedule_lateness: HistogramVec,
    admission_refusals: IntCounterVec,
    /// Workflow types with series of their own, per namespace (looked up without allocating:
    /// this runs on the committing thread for every fact).
    workflow_types: Mutex<(HashMap<String, HashSet<String>>, usize)>,
    /// Namespaces whose per-namespace series exist.
    namespaces: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut f = Families::new();
        let http = http::HttpSeries::new(&mut f);
        let metrics = Self {
            workflows_started: f.counters(
                "capstan_workflows_started_total",
                "Runs started (starts, children, continue-as-new successors, schedules' and service calls' starts).",
                &["namespace", "workflow_type"],
            ),
            workflows_closed: f.counters(
                "capstan_workflows_closed_total",
                "Runs closed, by how: completed, failed, cancelled, terminated, timed_out, continued (as new).",
                &["namespace", "workflow_type", "reason"],
            ),
            polls: f.counters(
                "capstan_polls_total",
                "Worker polls answered, by kind of work and outcome (task: work handed out; empty: the wait ran out).",
                &["kind", "outcome"],
            ),
            poll_seconds: f.histograms(
                "capstan_poll_wait_seconds",
                "How long a poll waited before it was answered.",
                &["kind", "outcome"],
                POLL_SECONDS,
            ),
            throttled: f.counters(
                "capstan_task_queue_throttled_total",
                "Claims a queue's flow-control limits held back, by the limit that held them (dispatch_rate, max_leased_tasks).",
                &["namespace", "kind", "queue", "held_by"],
            ),
            dispatches: f.counters(
                "capstan_task_dispatches_total",
                "Tasks handed to workers: first delivery, or again (a lease that ran out, a failed workflow task, an activity retry).",
                &["kind", "delivery"],
            ),
            lease_expiries: f.counters(
                "capstan_lease_expiries_total",
                "Leased tasks the clock took back before their worker reported.",
                &["namespace", "kind"],
            ),
            hand_offs: f.counters(
                "capstan_task_hand_offs_total",
                "Tasks leased to a parked poll in the transaction that made them ready (no claim).",
                &["namespace", "kind"],
            ),
            activity_timeouts: f.counters(
                "capstan_activity_timeouts_total",
                "Activity attempts and executions that ran out of a budget, by timeout.",
                &["namespace", "timeout"],
            ),
            timers_fired: f.counters("capstan_timers_fired_total", "Durable timers fired.", &["namespace"]),
            history_budget_crossings: f.counters(
                "capstan_history_budget_crossings_total",
                "Runs whose history crossed a budget threshold (pressure: approaching, continue_as_new_recommended).",
                &["namespace", "pressure"],
            ),
            commit_seconds: f.histogram(
                "capstan_store_commit_seconds",
                "Time of each durable COMMIT (SQLite: one group commit with its fsync; PostgreSQL: one transaction).",
                COMMIT_SECONDS,
            ),
            commit_transactions: f.histogram(
                "capstan_store_commit_transactions",
                "Transactions per durable commit (SQLite's group-commit batch size; 1 on PostgreSQL).",
                COMMIT_TRANSACTIONS,
            ),
            schedule_starts: f.counters(
                "capstan_schedule_starts_total",
                "Workflows schedules started on their own time (due or buffered occurrences).",
                &["namespace"],
            ),
            schedule_lateness: f.histograms(
                "capstan_schedule_lateness_seconds",
                "How long after its nominal occurrence a scheduled workflow started (jitter and buffering included).",
                &["namespace"],
                LATENESS_SECONDS,
            ),
            admission_refusals: f.counters(
                "capstan_admission_refused_total",
                "Requests refused before they did anything because the server was overloaded (429/503 with Retry-After), by what sheds: poll, control (new work), worker (reports).",
                &["plane"],
            ),
            http,
            workflow_types: Mutex::new((HashMap::new(), 0)),
            namespaces: Mutex::new(HashSet::new()),
            families: f,
        };
        metrics.declare_process();
        for kind in POLL_KINDS {
            for outcome in ["task", "empty"] {
                metrics.polls.with_label_values(&[kind, outcome]);
                metrics.poll_seconds.with_label_values(&[kind, outcome]);
            }
        }
        for kind in LEASED_KINDS {
            for delivery in ["first", "again"] {
                metrics.dispatches.with_label_values(&[kind.as_str(), delivery]);
            }
        }
        for plane in crate::admission::Plane::ALL {
            metrics.admission_refusals.with_label_values(&[plane.as_str()]);
        }
        metrics.namespace_seen("default");
        metrics
    }

    /// The process's own figures (CPU, memory, open files, threads, start time) and the build.
    fn declare_process(&self) {
        #[cfg(target_os = "linux")]
        self.families
            .registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("the process collector registers once");
        let build = IntGaugeVec::new(Opts::new("capstan_build_info", "The running build (always 1)."), &["version"]).expect("valid");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        self.families.registry.register(Box::new(build)).expect("registers once");
    }

    /// Creates a namespace's series with closed label sets, at zero, once.
    pub(crate) fn namespace_seen(&self, namespace: &str) {
        let mut seen = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(namespace) || seen.len() >= LABEL_VALUES_MAX {
            return;
        }
        seen.insert(namespace.to_string());
        for kind in LEASED_KINDS {
            self.lease_expiries.with_label_values(&[namespace, kind.as_str()]);
            self.hand_offs.with_label_values(&[namespace, kind.as_str()]);
        }
        for timeout in TIMEOUT_KINDS {
            self.activity_timeouts.with_label_values(&[namespace, timeout]);
        }
        self.timers_fired.with_label_values(&[namespace]);
        for pressure in ["approaching", "continue_as_new_recommended"] {
            self.history_budget_crossings.with_label_values(&[namespace, pressure]);
        }
        self.schedule_starts.with_label_values(&[namespace]);
        self.schedule_lateness.with_label_values(&[namespace]);
    }

    /// The label a workflow type is counted under: its own name while the cap allows (its
    /// series are created at zero the first time), else `_other`.
    fn workflow_type_label<'a>(&self, namespace: &str, workflow_type: &'a str) -> &'a str {
        let mut known = self.workflow_types.lock().unwrap_or_else(|p| p.into_inner());
        let (types, count) = &mut *known;
        if types.get(namespace).is_some_and(|of| of.contains(workflow_type)) {
            return workflow_type;
        }
        if *count >= LABEL_VALUES_MAX {
            return OTHER;
        }
        *count += 1;
        types.entry(namespace.to_string()).or_default().insert(workflow_type.to_string());
        self.workflows_started.with_label_values(&[namespace, workflow_type]);
        for reason in CLOSE_REASONS {
            self.workflows_closed.with_label_values(&[namespace, workflow_type, reason]);
        }
        workflow_type
    }

    /// A poll answered after `waited`: with a task, or empty.
    pub fn poll_answered(&self, kind: &str, found: bool, waited: Duration) {
        let outcome = if found { "task" } else { "empty" };
        self.polls.with_label_values(&[kind, outcome]).inc();
        self.poll_seconds.with_label_values(&[kind, outcome]).observe(waited.as_secs_f64());
    }

    /// A claim on a queue its flow-control limits held back (only queues an operator limited).
    pub fn throttled(&self, namespace: &str, kind: TaskKind, queue: &str, held_by: &str) {
        self.throttled.with_label_values(&[namespace, kind.as_str(), queue, held_by]).inc();
    }

    /// A task handed to a worker under its `fence`-th lease.
    pub fn dispatched(&self, kind: TaskKind, fence: u64) {
        let delivery = if fence > 1 { "again" } else { "first" };
        self.dispatches.with_label_values(&[kind.as_str(), delivery]).inc();
    }

    /// A request refused by admission control (`crate::admission`).
    pub fn admission_refused(&self, plane: &str) {
        self.admission_refusals.with_label_values(&[plane]).inc();
    }

    /// Workflows a schedule started on its own time, each `lateness_ms` after its occurrence.
    pub fn schedule_started(&self, namespace: &str, lateness_ms: &[i64]) {
        self.namespace_seen(namespace);
        for late in lateness_ms {
            self.schedule_starts.with_label_values(&[namespace]).inc();
            self.schedule_lateness
                .with_label_values(&[namespace])
                .observe(*late as f64 / 1000.0);
        }
    }
}

/// Times a poll from its arrival; records it when told how it ended (a poll that failed is
/// not a poll answered).
pub struct PollTimer {
    kind: &'static str,
    started: std::time::Instant,
}

impl PollTimer {
    pub fn start(kind: &'static str) -> Self {
        Self {
            kind,
            started: std::time::Instant::now(),
        }
    }

    pub fn answered(self, metrics: &Metrics, found: bool) {
        metrics.poll_answered(self.kind, found, self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} in\n{text}"))
    }

    #[test]
    fn schedule_starts_count_each_workflow_and_its_lateness() {
        let metrics = Metrics::new();
        metrics.schedule_started("billing", &[1_500, 40]);
        metrics.schedule_started("billing", &[]);
        let text = metrics.families_text();
        assert_eq!(
            line(&text, r#"capstan_schedule_starts_total{namespace="billing"}"#)
                .rsplit(' ')
                .next(),
            Some("2")
        );
        assert_eq!(
            line(&text, r#"capstan_schedule_lateness_seconds_sum{namespace="billing"}"#)
                .rsplit(' ')
                .next(),
            Some("1.54")
        );
        assert_eq!(
            line(&text, r#"capstan_schedule_lateness_seconds_bucket{namespace="billing",le="0.05"}"#)
                .rsplit(' ')
                .next(),
            Some("1"),
            "40 ms late falls in the 50 ms bucket, 1.5 s does not"
        );
    }

    #[test]
    fn dispatches_tell_a_first_lease_from_a_later_one() {
        let metrics = Metrics::new();
        metrics.dispatched(TaskKind::Workflow, 1);
        metrics.dispatched(TaskKind::Workflow, 2);
        metrics.dispatched(TaskKind::Workflow, 3);
        let text = metrics.families_text();
        let count = |delivery: &str| {
            line(
                &text,
                &format!(r#"capstan_task_dispatches_total{{delivery="{delivery}",kind="workflow"}}"#),
            )
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
        };
        assert_eq!((count("first"), count("again")), ("1".to_string(), "2".to_string()));
    }
}
