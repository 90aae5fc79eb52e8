//! The application layer: one function per use case, written once, called by the HTTP server
//! (and its background loops) and by the deterministic simulator, so a simulated seed runs the
//! same policy a request or a duty runs.
//!
//! A use case takes [`Services`] (the store, the sources of time and ids, the limits) and a
//! typed request; it neither reads a clock nor mints an id except through those sources, never
//! speaks HTTP, and returns what happened (or an [`AppError`]) for the caller to log, render or
//! check. What stays in the server: parsing wire JSON into requests, rendering answers, auth,
//! long-poll waiting and wake-ups.
//!
//! - [`control`]: start, signal, cancel/terminate, repair, archive (and keyed idempotency).
//! - [`updates`]: updates, with the validation round trip a caller supplies.
//! - [`polls`]: a worker's poll for a task (one look; the caller long-polls).
//! - [`queries`]: putting a query to a worker.
//! - [`reports`]: workflow task and activity reports from workers.
//! - [`cancellation`]: cooperative cancellation (request, delivery, activity stop receipts).
//! - [`redrive`]: a failed run resumed at its failed step.
//! - [`standalone`]: standalone activities (an activity started by a client, on a host run).
//! - [`sessions`]: worker sessions (acquire, renew, close; renewal by activity heartbeats).
//! - [`local_activities`]: prepared local activities (admission, supervision, outcomes).
//! - [`ledger`]: an operator's resolution of an `outcome_unknown` entry.
//! - [`credentials`]: named credentials an admin manages over the API.
//! - [`workers`]: worker registration, heartbeats, deregistration; build-id rollouts.
//! - [`workflow_streams`]: a client's appends to and closes of a run's output streams.
//! - [`duties`]: the clock's deadline pass and the scheduler's pass.
//! - [`contracts`], [`search_attributes`]: what requests are admitted against.
//! - [`external_payloads`], [`message_streams`], [`service_calls`]: payload references, message
//!   streams, Nexus calls made outside a run.

pub mod batches;
pub mod cancellation;
pub mod catalog;
pub mod contracts;
pub mod control;
pub mod credentials;
pub mod duties;
pub mod external_payloads;
pub mod imports;
pub mod ledger;
pub mod listing;
pub mod local_activities;
pub mod message_streams;
pub mod pause;
pub mod polls;
pub mod queries;
pub mod queue_limits;
pub mod redrive;
pub mod reports;
pub mod schedules;
pub mod search_attributes;
pub mod service_calls;
pub mod sessions;
pub mod standalone;
pub mod updates;
pub mod workers;
pub mod workflow_streams;

use capstan_engine::{Limits, Millis, Reason, Refusal};
use capstan_store::prelude::*;
use capstan_store::{BuildIdRollout, Sources, Store, StoreError, StoreResult};
use std::future::Future;

/// What every use case runs on. The server implements it on its shared state; the simulator
/// on its own, with a manual clock and seeded ids.
pub trait Services: Send + Sync {
    type Store: Store;

    fn store(&self) -> &Self::Store;
    fn sources(&self) -> &Sources;
    fn limits(&self) -> &Limits;

    /// A queue's build-id rollouts (a server may cache them briefly).
    fn rollouts(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<BuildIdRollout>>> + Send {
        self.store().build_id_rollouts(namespace, queue)
    }

    /// The worker registrations this node last saw, if it keeps them (`polls::poller`).
    fn known_registrations(&self) -> Option<&polls::KnownRegistrations> {
        None
    }

    fn now(&self) -> Millis {
        self.sources().now_ms()
    }

    fn new_id(&self) -> String {
        self.sources().new_id()
    }
}

/// Why a use case did not happen.
#[derive(Debug)]
pub enum AppError {
    /// A request field is out of bounds (the HTTP layer answers `422 validation_failed`
    /// naming it).
    Invalid { field: String, message: String },
    /// The store or a rule refused, or the database failed.
    Store(StoreError),
}

pub type AppResult<T> = Result<T, AppError>;

impl AppError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AppError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The refusal, if a rule refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            AppError::Store(StoreError::Refused(refusal)) => Some(refusal),
            _ => None,
        }
    }

    pub fn reason(&self) -> Option<Reason> {
        match self {
            AppError::Invalid { .. } => Some(Reason::ValidationFailed),
            _ => self.refusal().map(|r| r.reason),
        }
    }
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        AppError::Store(error)
    }
}

impl From<Refusal> for AppError {
    fn from(refusal: Refusal) -> Self {
        AppError::Store(StoreError::Refused(refusal))
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Invalid { field, message } => write!(f, "validation_failed ({field}): {message}"),
            AppError::Store(error) => write!(f, "{error}"),
        }
    }
}
