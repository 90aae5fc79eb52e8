//! Overload that bends: a request that would only wait in line is refused before it does
//! anything, with a `Retry-After`, instead of queueing until its client times out.
//!
//! The signal is how long writes stand in line before they run (`capstan_store::pressure`:
//! the smallest wait of the last 100 ms, so a burst that drains is not a queue). Each kind of
//! request is refused past its own share of the target, so that under rising load they shed in
//! this order:
//! 1. **polls** (half the target): a worker told `429 long_poll_capacity_exhausted` sleeps the
//!    advertised second and polls again (both DW SDKs honour it), and takes no new work
//!    meanwhile. A node holding `max_parked_polls` already lets a poll take a task that is
//!    ready, but refuses it the wait for one;
//! 2. **new work** (writes to workflows, activities and schedules, at the target): starts,
//!    signals, updates, cancellations are answered `503 server_overloaded` (`retryable`,
//!    `retry_after_seconds`); the SDKs' transports retry them with backoff;
//! 3. **progress of work already admitted** (a worker's reports, at twice the target): task
//!    completions, heartbeats, registrations; they free leases, so they go last.
//!
//! New work and reports also each have a limit on requests in flight that follows their
//! latency (`limit.rs`): a server that waits for its CPU rather than its writes is bent by
//! that. Both refusals are made by the outermost layer ([`gate`]) from a body rendered once,
//! so that refusing costs next to nothing. Reads, health, cluster info, metrics and the
//! operators' own routes are never refused here. docs/reliability.md, Overload.

mod limit;

pub use limit::InflightLimit;

use crate::error::ApiError;
use crate::{AppState, Shared};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use capstan_engine::{Reason, Refusal};
use capstan_store::Store;
use serde_json::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// How long a refused client is told to wait.
pub const RETRY_AFTER_SECONDS: u64 = 1;

#[derive(Clone, Debug)]
pub struct AdmissionSettings {
    /// The queueing delay of writes past which new work is refused (polls at half of it,
    /// worker reports at twice it). Zero turns admission off.
    pub queue_delay_target: Duration,
    /// Long polls one node holds parked at most.
    pub max_parked_polls: usize,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        Self {
            queue_delay_target: Duration::from_millis(100),
            max_parked_polls: 10_000,
        }
    }
}

/// The kinds of request that shed in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Poll,
    Control,
    Worker,
}

impl Plane {
    pub const ALL: [Plane; 3] = [Plane::Poll, Plane::Control, Plane::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Plane::Poll => "poll",
            Plane::Control => "control",
            Plane::Worker => "worker",
        }
    }

    /// The queueing delay past which this plane is refused.
    fn threshold(self, target: Duration) -> Duration {
        match self {
            Plane::Poll => target / 2,
            Plane::Control => target,
            Plane::Worker => target * 2,
        }
    }
}

/// Whether a request of `plane` is refused now, given the writes' standing queue.
fn overloaded<S: Store>(state: &AppState<S>, plane: Plane) -> Option<Duration> {
    let target = state.config.admission.queue_delay_target;
    if target.is_zero() {
        return None;
    }
    let standing = state.store.write_queue_delay();
    (standing >= plane.threshold(target)).then_some(standing)
}

fn refused<S: Store>(state: &AppState<S>, plane: Plane, refusal: Refusal) -> Response {
    state.metrics.admission_refused(plane.as_str());
    ApiError::from(refusal.with("retryable", true).with("retry_after_seconds", RETRY_AFTER_SECONDS)).into_response()
}

/// A long poll refused before it looks, under write pressure (its claim would be a write); in
/// the shape both SDKs back off on. `None` admits it.
pub fn shed_poll<S: Store>(state: &AppState<S>, task_kind: &str, queue: &str, poll_request_id: Option<&str>) -> Option<Response> {
    let standing = overloaded(state, Plane::Poll)?;
    let why = format!(
        "The server is shedding polls under load (writes wait {} ms); poll again in {RETRY_AFTER_SECONDS} s.",
        standing.as_millis()
    );
    Some(poll_refusal(state, why, task_kind, queue, poll_request_id))
}

/// Whether this node holds its most parked polls: a poll may still take a task that is ready
/// now, but may not wait for one ([`parking_refused`] when it found none).
pub fn parking_full<S: Store>(state: &AppState<S>) -> bool {
    state.store.parked_polls() >= state.config.admission.max_parked_polls
}

/// The answer to a poll that found nothing and could not park.
pub fn parking_refused<S: Store>(state: &AppState<S>, task_kind: &str, queue: &str, poll_request_id: Option<&str>) -> Response {
    let why = format!(
        "This node holds {} long polls, its most, and nothing was ready; poll again in {RETRY_AFTER_SECONDS} s.",
        state.config.admission.max_parked_polls
    );
    poll_refusal(state, why, task_kind, queue, poll_request_id)
}

fn poll_refusal<S: Store>(state: &AppState<S>, why: String, task_kind: &str, queue: &str, poll_request_id: Option<&str>) -> Response {
    let refusal = Refusal::new(Reason::LongPollCapacityExhausted, why)
        .with("poll_status", "long_poll_capacity_exhausted")
        .with("task", Value::Null)
        .with("task_kind", task_kind)
        .with("task_queue", queue)
        .with("poll_request_id", poll_request_id.map_or(Value::Null, Value::from));
    refused(state, Plane::Poll, refusal)
}

/// The in-flight limits of the planes that have one (polls wait by design: they have none).
#[derive(Debug, Default)]
pub struct Limits {
    pub control: InflightLimit,
    pub worker: InflightLimit,
}

impl Limits {
    /// Each limited plane and its limit (`/metrics` reads them all).
    pub fn planes(&self) -> [(Plane, &InflightLimit); 2] {
        [(Plane::Control, &self.control), (Plane::Worker, &self.worker)]
    }

    fn of(&self, plane: Plane) -> &InflightLimit {
        match plane {
            Plane::Worker => &self.worker,
            _ => &self.control,
        }
    }
}

/// The plane a request sheds with, by its method and path; `None`: never refused here (reads,
/// polls, the operators' routes).
fn plane_of(method: &Method, path: &str) -> Option<Plane> {
    if *method == Method::GET {
        return None;
    }
    let path = path.strip_prefix("/api")?;
    if let Some(worker) = path.strip_prefix("/worker/") {
        return (!worker.ends_with("/poll")).then_some(Plane::Worker);
    }
    ["/workflows", "/activities", "/schedules"]
        .iter()
        .any(|new_work| path.starts_with(new_work))
        .then_some(Plane::Control)
}

/// The refusal of new work or a report, rendered once (from the catalogue, in the shape every
/// refusal has): under overload the refusals must cost next to nothing, or they take the CPU
/// the admitted requests need.
fn overloaded_response() -> Response {
    static BODY: LazyLock<Bytes> = LazyLock::new(|| {
        let refusal = Refusal::new(
            Reason::ServerOverloaded,
            format!("The server is overloaded; nothing was done. Retry in {RETRY_AFTER_SECONDS} s."),
        )
        .with("retryable", true)
        .with("retry_after_seconds", RETRY_AFTER_SECONDS);
        let body = Value::Object(ApiError::from(refusal).body());
        Bytes::from(serde_json::to_vec(&body).expect("a refusal serializes"))
    });
    (
        crate::error::status_of(Reason::ServerOverloaded),
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS)),
        ],
        BODY.clone(),
    )
        .into_response()
}

/// The outermost layer: new work and worker reports are refused here, before anything else
/// reads them, when their plane is past its share of the writes' queue or its in-flight limit.
pub async fn gate<S: Store>(State(state): State<Shared<S>>, request: Request, next: Next) -> Response {
    let Some(plane) = plane_of(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    if state.config.admission.queue_delay_target.is_zero() {
        return next.run(request).await;
    }
    let place = match overloaded(&state, plane) {
        Some(_) => None,
        None => state.admission.of(plane).try_acquire(),
    };
    let Some(place) = place else {
        state.metrics.admission_refused(plane.as_str());
        return overloaded_response();
    };
    let response = next.run(request).await;
    drop(place);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_work_and_reports_shed_and_reads_polls_and_operators_do_not() {
        let post = Method::POST;
        assert_eq!(plane_of(&post, "/api/workflows"), Some(Plane::Control));
        assert_eq!(plane_of(&post, "/api/workflows/w/signal/s"), Some(Plane::Control));
        assert_eq!(plane_of(&post, "/api/worker/workflow-tasks/t/complete"), Some(Plane::Worker));
        assert_eq!(plane_of(&post, "/api/worker/workflow-tasks/poll"), None);
        assert_eq!(plane_of(&Method::GET, "/api/workflows"), None);
        assert_eq!(plane_of(&post, "/api/namespaces"), None);
        assert_eq!(plane_of(&post, "/api/ledger/x/resolve"), None);
        assert_eq!(plane_of(&post, "/metrics"), None);
    }

    #[tokio::test]
    async fn the_prerendered_refusal_is_the_catalogues_503_with_retry_after() {
        let response = overloaded_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["reason"], Reason::ServerOverloaded.as_str());
        assert_eq!(
            (body["retryable"].clone(), body["retry_after_seconds"].clone()),
            (Value::Bool(true), 1.into())
        );
        assert!(body["message"].as_str().unwrap().contains("nothing was done"));
    }
}
