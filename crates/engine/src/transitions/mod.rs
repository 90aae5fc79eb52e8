//! The transitions of a run. Each takes the run's state, the shared [`Cx`] and its inputs, and
//! either changes the state (recording events and task changes in `cx.effects`) or returns a
//! [`Refusal`]. Callers persist the changed state and the effects only on `Ok`; on `Err` they
//! discard both, so a refused report leaves nothing behind.

use crate::ledger::ResultClass;
use crate::refusal::{Reason, Refusal};
use crate::service_call::LinkedRunClosed;
use crate::timefmt::iso8601;
use crate::{Millis, RunState};

macro_rules! obj {
    ($($key:expr => $value:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut map = Map::new();
        $(map.insert($key.to_string(), json!($value));)*
        map
    }};
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(Reason::InvalidCommands, message)
}

/// Refuses what only workflow code can answer (an update, a query, a cooperative cancellation)
/// on a standalone activity's host run, which has none; cancel or terminate it instead.
pub fn require_workflow_code(run: &RunState) -> Result<(), Refusal> {
    match run.standalone {
        None => Ok(()),
        Some(_) => Err(Refusal::new(
            Reason::ActivityHostRun,
            "This run hosts a standalone activity: it has no workflow code to update, query or cancel cooperatively. Cancel or terminate it instead.",
        )
        .with("workflow_type", run.workflow_type.clone())),
    }
}

fn min_opt(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

mod activity;
mod activity_lease;
mod activity_stop;
mod cancellation;
mod children;
mod close;
mod commands;
mod control;
mod deadline;
mod events;
mod import;
mod ledger_probe;
mod ledger_steps;
mod message_stream;
mod pause;
mod prepared_local;
mod redrive;
mod service_calls;
mod standalone;
mod start;
mod sticky;
mod workflow_task;

pub use activity::*;
pub use activity_lease::*;
pub use activity_stop::{acknowledge_activity_cancellation, stopped_attempt};
pub use cancellation::*;
pub use children::*;
pub use control::*;
pub use deadline::*;
use events::{AttemptRef, LocalActivityRef, LocalAttemptRef, NextAttempt, TimerWait, UpdateEnd, UpdateRef};
pub use import::import_run;
pub use ledger_probe::answer_probe;
use ledger_probe::{mark_outcome_unknown, probe_answer};
pub use ledger_steps::*;
pub use message_stream::{append_stream_message, check_stream_progress, note_stream_input, AppendStreamMessage};
pub use pause::{pause, resume};
pub use prepared_local::*;
pub use redrive::{redrive, RedriveOutcome};
use service_calls::start_service_operation;
pub use service_calls::{admit_service_call, cancelled_call, resolve_service_call, settle_call, AdmittedCall};
use standalone::{activity_resolved, Resolution};
pub use standalone::{standalone_default_retry, start_standalone_activity, StartStandaloneActivity};
pub use start::*;
pub use sticky::{check_sticky_claim, record_sticky_claim};
pub use workflow_task::*;
