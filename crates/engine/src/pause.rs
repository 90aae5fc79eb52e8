//! An operator's hold on a run: while a run is paused none of its workflow or activity tasks is
//! dispatched (leased ones finish), while its timers fire, signals, updates and messages are
//! accepted, and its timeouts keep running. DW has no such hold, and its history event types
//! are a closed set, so a pause is recorded on the run (and in the audit trail), not in history.

use crate::{Millis, Principal, RunState, RunStatus};
use serde::{Deserialize, Serialize};

/// Who paused a run (or a task queue's kind of tasks), when, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    pub paused_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
}

/// What counts of runs tell apart: an open run, held or not, or how a run closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunClass {
    Open,
    Paused,
    Closed(RunStatus),
}

impl RunClass {
    pub fn of(run: &RunState) -> Self {
        match (run.is_closed(), run.paused.is_some()) {
            (true, _) => RunClass::Closed(run.status),
            (false, true) => RunClass::Paused,
            (false, false) => RunClass::Open,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunClass::Open => "open",
            RunClass::Paused => "paused",
            RunClass::Closed(status) => status.as_str(),
        }
    }
}
