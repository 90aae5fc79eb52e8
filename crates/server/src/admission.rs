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
//! 2. **new work** (the control plane's writes, at the target): starts, signals, updates,
//!    cancellations are answered `503 server_overloaded` (`retryable`, `retry_after_seconds`);
//!    the SDKs' transports retry them with backoff;
//! 3. **progress of work already admitted** (a worker's reports, at twice the target): task
//!    completions, heartbeats, registrations; they free leases, so they go last.
//!
//! Reads, health, cluster info, metrics and the operators' own routes (namespaces,
//! credentials) are never refused here. docs/reliability.md, Overload.

use crate::error::ApiError;
use crate::{AppState, Shared};
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use capstan_engine::{Reason, Refusal};
use capstan_store::Store;
use serde_json::Value;
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

fn refuse_work<S: Store>(state: &AppState<S>, plane: Plane) -> Option<Response> {
    let standing = overloaded(state, plane)?;
    let refusal = Refusal::new(
        Reason::ServerOverloaded,
        format!(
            "The server is overloaded (writes wait {} ms); nothing was done. Retry in {RETRY_AFTER_SECONDS} s.",
            standing.as_millis()
        ),
    );
    Some(refused(state, plane, refusal))
}

/// The control plane's writes: refused past the target.
pub async fn admit_control<S: Store>(State(state): State<Shared<S>>, request: Request, next: Next) -> Response {
    if request.method() != Method::GET {
        if let Some(refusal) = refuse_work(&state, Plane::Control) {
            return refusal;
        }
    }
    next.run(request).await
}

/// A worker's reports: refused past twice the target. Polls are admitted by their handlers
/// ([`shed_poll`]), which know the queue the refusal must name.
pub async fn admit_worker<S: Store>(State(state): State<Shared<S>>, request: Request, next: Next) -> Response {
    if request.method() != Method::GET && !request.uri().path().ends_with("/poll") {
        if let Some(refusal) = refuse_work(&state, Plane::Worker) {
            return refusal;
        }
    }
    next.run(request).await
}
