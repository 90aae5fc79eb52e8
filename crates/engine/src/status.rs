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
    pub const ALL: [RunStatus; 7] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Terminated,
    ];

    /// The status of its wire name (`as_str`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }

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
    pub const ALL: [ClosedReason; 6] = [
        ClosedReason::Completed,
        ClosedReason::Failed,
        ClosedReason::Cancelled,
        ClosedReason::Terminated,
        ClosedReason::TimedOut,
        ClosedReason::Continued,
    ];

    /// The reason of its wire name (`as_str`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == name)
    }

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
