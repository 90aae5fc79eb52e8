//! Explicit bounds. Every limit the engine enforces is named here with its unit last.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Limits {
    /// Largest accepted payload blob (base64 text) in any envelope.
    pub payload_bytes_max: usize,
    /// History events one run may hold before commands are refused.
    pub history_events_max: u64,
    /// Commands accepted in one workflow-task completion.
    pub commands_per_completion_max: usize,
    /// Open activity executions per run.
    pub pending_activities_max: usize,
    /// Open timers per run.
    pub pending_timers_max: usize,
    /// Signals accepted and not yet handed to workflow code, per run (DW's `pending_signal_count`).
    pub pending_signals_max: usize,
    /// Receipts kept in the run document per kind (prepared local attempts and checkpoints) so an
    /// identical retried report gets its original answer. Worker task receipts live on task rows.
    pub closed_task_receipts_max: usize,
    /// Longest delay a workflow may ask for (timers, waits, retry backoff), in seconds.
    pub delay_seconds_max: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            payload_bytes_max: 2 * 1024 * 1024,
            history_events_max: 50_000,
            commands_per_completion_max: 1_000,
            pending_activities_max: 2_000,
            pending_timers_max: 2_000,
            pending_signals_max: 5_000,
            closed_task_receipts_max: 64,
            delay_seconds_max: 10 * 365 * 24 * 3600,
        }
    }
}
