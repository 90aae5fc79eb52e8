//! Where a run is in its life ([`RunStatus`]) and why a closed run closed ([`ClosedReason`]).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    Pending,
    Running,
    Waiting,
    Completed,
    Failed,
    Cancelled,
    Terminated,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Terminated => "terminated",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled | RunStatus::Terminated
        )
    }

    /// The list-filter bucket: `running`, `completed` or `failed`.
    pub fn bucket(self) -> &'static str {
        match self {
            RunStatus::Pending | RunStatus::Running | RunStatus::Waiting => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed | RunStatus::Cancelled | RunStatus::Terminated => "failed",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClosedReason {
    Completed,
    Failed,
    Cancelled,
    Terminated,
    TimedOut,
    /// Continued as new: the instance goes on in its next run.
    Continued,
}

impl ClosedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ClosedReason::Completed => "completed",
            ClosedReason::Failed => "failed",
            ClosedReason::Cancelled => "cancelled",
            ClosedReason::Terminated => "terminated",
            ClosedReason::TimedOut => "timed_out",
            ClosedReason::Continued => "continued",
        }
    }
}
