//! Distinct id types, so a task id can never be passed where a run id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_string())
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }
    )*};
}

id_type!(
    /// Caller-chosen workflow instance id, unique per namespace forever.
    WorkflowId,
    /// Server-generated id of one run of an instance.
    RunId,
    /// A task row: workflow, activity, timer or run-deadline task.
    TaskId,
    /// One scheduled activity call, stable across its retries.
    ActivityExecutionId,
    /// One leased attempt of an activity execution: the activity fencing token.
    ActivityAttemptId,
    /// A durable timer (user timer or a wait's timeout).
    TimerId,
    /// A received signal.
    SignalId,
    /// A control-plane command (start, signal, cancel, terminate) recorded on the events it caused.
    CommandId,
    /// An open condition or signal wait.
    WaitId,
    /// A history event.
    EventId,
);

/// Where new ids come from. The server hands ULIDs; tests hand a counter.
pub trait IdSource {
    fn next_id(&mut self) -> String;
}

/// Deterministic ids for tests and simulations: `prefix-000001`, `prefix-000002`, …
#[derive(Debug, Clone)]
pub struct SequentialIds {
    prefix: String,
    next: u64,
}

impl SequentialIds {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            next: 1,
        }
    }
}

impl IdSource for SequentialIds {
    fn next_id(&mut self) -> String {
        let id = format!("{}-{:06}", self.prefix, self.next);
        self.next += 1;
        id
    }
}

/// A client-chosen name (a workflow id, a message stream, a message id): 1 to `max` bytes of
/// letters, digits, `.`, `_`, `:` and `-`, DW's one character class for them.
pub fn valid_client_name(value: &str, max: usize) -> bool {
    (1..=max).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}
