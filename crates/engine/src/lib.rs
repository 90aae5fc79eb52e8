//! The pure core of Capstan.
//!
//! Everything that decides *what happens* to a workflow run lives here: which history events a
//! command produces, when a workflow or activity task exists, who holds its lease and under which
//! fence, when a timer fires, when a report is refused. The crate does no IO, has no async and
//! never reads a clock: callers pass `now` (milliseconds since the Unix epoch) and an [`IdSource`].
//! Given the same inputs it makes the same decisions, which is what the unit and property tests
//! rely on.
//!
//! The store feeds it: load a [`RunState`], call one transition, persist the [`Effects`] it
//! produced in one transaction — or nothing at all when the transition returns a [`Refusal`].

pub mod activity_stop;
pub mod cancellation;
mod canonical;
pub mod command;
pub mod contract;
pub mod fairness;
pub mod flow;
pub mod history;
pub mod history_budget;
pub mod ids;
pub mod import;
pub mod ledger;
pub mod ledger_probe;
pub mod limits;
pub mod local_activity;
pub mod memo;
pub mod message_stream;
pub mod observation;
pub mod pause;
pub mod payload;
pub mod principal;
pub mod query;
pub mod redrive;
pub mod refusal;
pub mod run;
pub mod schedule;
pub mod scheduling;
pub mod selection;
pub mod service_call;
pub mod session;
pub mod standalone;
pub mod status;
pub mod step_log;
pub mod sticky;
pub mod task;
pub mod task_failure;
pub mod timefmt;
pub mod trace;
mod transitions;
pub mod visibility;
pub mod workflow_stream;

pub use activity_stop::{StopAcknowledgement, StopReceipt, StoppedAttempt};
pub use cancellation::{AwaitedStops, CancellationDelivery, CancellationRequest, CANCELLATION_CONTEXT_SCHEMA};
pub use command::*;
pub use contract::CommandContract;
pub use history::{chain_hash, verify_chain, verify_chain_from, EventType, HistoryEvent, GENESIS_HASH};
pub use history_budget::HistoryBudget;
pub use ids::*;
pub use ledger::{ActionDefinition, ActionPin, LedgerCheckpoint, LedgerEntry, LedgerState, RecoveryMode};
pub use limits::Limits;
pub use local_activity::*;
pub use memo::{MemoBase, MemoCodec, MergedMemo};
pub use message_stream::{MessageStream, StreamAppendReceipt, StreamProgress, MESSAGE_STREAM_SIGNAL};
pub use observation::Observation;
pub use pause::{PauseRecord, RunClass};
pub use payload::{Payload, PayloadReference};
pub use principal::Principal;
pub use query::{QueryKind, QueryOutcome, QueryState, QueryTask};
pub use redrive::{redrive_plan, Redrive, RedrivePlan};
pub use refusal::{Reason, Refusal};
pub use run::*;
pub use scheduling::TaskScheduling;
pub use selection::{SelectEntry, SelectionBook};
pub use session::{AcquireOutcome, SessionClaimant, SessionOptions, SessionStatus, WorkerSession};
pub use standalone::{StandaloneActivity, STANDALONE_ACTIVITY_TYPE};
pub use status::{ClosedReason, RunStatus};
pub use sticky::{ReplayMode, StickyAffinity, StickyClaim};
pub use task::*;
pub use task_failure::{TaskFailureNote, WorkflowTaskFailure};
pub use trace::TraceContext;
pub use transitions::*;

/// Milliseconds since the Unix epoch. Time is always an input to the engine.
pub type Millis = i64;
