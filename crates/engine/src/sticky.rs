//! Sticky execution: a worker that keeps a run's replayed state in its cache claims the run
//! when it completes a workflow task; the run's next workflow task is held for that worker for
//! a short while, and the task tells whoever leases it whether their cache can be trusted.
//!
//! Correctness never depends on it. Every workflow task still carries (and pages) the run's
//! history from sequence 1; the replay mode only tells the SDK whether its cache can be used:
//! - `sticky_hit_expected`: the lease went to the worker that claimed the run, inside its TTL;
//! - `forced_cold_replay`: the run was claimed, but by another worker or the claim ran out;
//! - `cold_replay`: nobody claimed it.
//!
//! The affinity lives in the run document (it survives restarts and is seen by every node of
//! a cluster); the store copies it onto the ready task row so pollers can filter on it.

use crate::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The longest cache lifetime a worker may claim (DW's bound).
pub const STICKY_TTL_SECONDS_MAX: i64 = 3600;

/// How long a ready workflow task waits for the worker that claimed its run before any other
/// compatible worker may take it (Temporal's sticky schedule-to-start default). A claimer that
/// died or stopped polling delays its runs by at most this much.
pub const STICKY_HOLD_MS: i64 = 5_000;

/// A worker's claim, sent with a workflow task completion (`sticky_cache`).
#[derive(Clone, Debug, PartialEq)]
pub struct StickyClaim {
    pub worker_id: String,
    pub workflow_id: String,
    pub run_id: String,
    pub build_id: String,
    pub ttl_seconds: i64,
    /// The worker's cumulative cache counters (`hit`, `miss`, `eviction`, `forced_cold_replay`).
    pub metrics: Map<String, Value>,
}

/// The run's current sticky owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StickyAffinity {
    pub worker_id: String,
    pub build_id: String,
    pub claimed_at: Millis,
    pub expires_at: Millis,
    /// The counters the worker reported with its claim.
    #[serde(default)]
    pub metrics: Map<String, Value>,
}

/// What the leasing worker may expect of its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayMode {
    ColdReplay,
    StickyHitExpected,
    ForcedColdReplay,
}

impl ReplayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayMode::ColdReplay => "cold_replay",
            ReplayMode::StickyHitExpected => "sticky_hit_expected",
            ReplayMode::ForcedColdReplay => "forced_cold_replay",
        }
    }
}
