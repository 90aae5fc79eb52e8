//! Standalone activities (DW's `Client.start_activity`): an activity started by a client, not
//! by a workflow. It lives on a *host run* of type [`STANDALONE_ACTIVITY_TYPE`] whose instance
//! id is the activity id. The host run has no workflow task, ever: its single activity is step 1
//! and the activity's end closes the run (completed with the result, or failed).

use crate::ids::ActivityExecutionId;
use crate::Millis;
use serde::{Deserialize, Serialize};

/// The workflow type of every host run, as DW names it.
pub const STANDALONE_ACTIVITY_TYPE: &str = "dw.standalone_activity";

/// What a host run keeps about its activity after the execution itself is gone (an execution
/// leaves `RunState::activities` when it ends, but a describe must still report it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StandaloneActivity {
    pub execution_id: ActivityExecutionId,
    pub activity_type: String,
    /// The class name the client gave (`activity_type` when it gave none).
    pub activity_class: String,
    pub schedule_to_start_deadline_at: Option<Millis>,
    pub schedule_to_close_deadline_at: Option<Millis>,
    /// Attempts started, frozen when the execution ended.
    #[serde(default)]
    pub attempt_count: u32,
    /// How the execution ended (`completed`, `failed`, `cancelled`); `None` while it is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}
