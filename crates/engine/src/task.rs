//! Tasks: the units of work the server hands out or runs itself.
//!
//! A task is always in exactly one [`TaskState`]; a leased task carries its owner, expiry and
//! fence together in one [`Lease`]. The fence grows by one every time ownership passes, so a
//! report carrying an older fence can be recognised and refused.

use crate::payload::Payload;
use crate::{ActivityAttemptId, ActivityExecutionId, CommandId, Millis, SignalId, TaskId, TimerId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskKind {
    /// Leased by workflow pollers; one ready-or-leased per run at a time.
    Workflow,
    /// Leased by activity pollers; one per activity attempt.
    Activity,
    /// Server-internal: fires at `deadline_at`.
    Timer,
    /// Server-internal: times the run out at `deadline_at`.
    RunDeadline,
    /// Leased by query pollers; ephemeral, outside any run (see `query.rs`).
    Query,
}

impl TaskKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Workflow => "workflow",
            TaskKind::Activity => "activity",
            TaskKind::Timer => "timer",
            TaskKind::RunDeadline => "run_deadline",
            TaskKind::Query => "query",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: String,
    pub expires_at: Millis,
    /// Ownership generation. For workflow tasks this is the `workflow_task_attempt`.
    pub fence: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    Ready,
    Leased(Lease),
}

/// Why a workflow task exists, handed to the worker as its resume context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ResumeContext {
    Signal {
        signal_id: SignalId,
        signal_name: String,
        arguments: Payload,
        command_id: CommandId,
    },
    /// A dedicated task that runs one accepted update's handler.
    Update {
        update_id: String,
        update_name: String,
        command_id: CommandId,
    },
    /// The regular task after a successful update: the handler may have changed what an open
    /// wait depends on, and like a signal the update counts as that wait's receiver.
    AfterUpdate { update_id: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TaskDetail {
    Workflow {
        resume: Option<ResumeContext>,
        /// History visible to the current lease: events up to this sequence (snapshot at lease).
        history_snapshot: u64,
        /// What the current lease's holder may expect of its replay cache (set at lease).
        #[serde(default)]
        replay_mode: Option<crate::sticky::ReplayMode>,
    },
    Activity {
        execution_id: ActivityExecutionId,
        activity_type: String,
        attempt_number: u32,
        attempt_id: Option<ActivityAttemptId>,
        last_heartbeat_at: Option<Millis>,
        /// When the current attempt was leased: the start of its start-to-close budget.
        #[serde(default)]
        started_at: Option<Millis>,
    },
    Timer {
        timer_id: TimerId,
    },
    RunDeadline,
    /// Closes a cooperatively cancelled run whose cleanup outlived its deadline.
    CancellationDeadline,
}

/// An open task. Closed tasks leave the run state; the store keeps their rows for lookups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub kind: TaskKind,
    pub state: TaskState,
    /// Task queue polled for it; empty for server-internal tasks.
    pub queue: String,
    /// Not offered to pollers before this instant (retry backoff, workflow-task backoff).
    pub available_at: Millis,
    /// When the engine must look at this task again without worker traffic: timer due, run
    /// deadline, lease expiry, activity timeout.
    pub deadline_at: Option<Millis>,
    /// Number of leases granted so far; the current lease's fence.
    pub fence: u64,
    pub created_at: Millis,
    pub detail: TaskDetail,
}

impl Task {
    pub fn lease(&self) -> Option<&Lease> {
        match &self.state {
            TaskState::Leased(lease) => Some(lease),
            TaskState::Ready => None,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state, TaskState::Ready)
    }
}

/// How a task left the run's open set; kept in the store row for later lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskClosure {
    Completed,
    Failed,
    TimedOut,
    Cancelled,
}

impl TaskClosure {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskClosure::Completed => "completed",
            TaskClosure::Failed => "failed",
            TaskClosure::TimedOut => "timed_out",
            TaskClosure::Cancelled => "cancelled",
        }
    }
}
