//! A workflow task's failure, as its worker reported it, kept on the run until a workflow task
//! completes again.
//!
//! A failed workflow task writes no history (DW writes none either: the run is not failed, the
//! task is offered again). Without this note a run looping on task failures — a non-deterministic
//! change, an unregistered workflow type — would show no cause anywhere. The note is bounded:
//! the run document is rewritten by every transaction, so a long message or stack trace is cut
//! to [`MESSAGE_LIMIT`] / [`STACK_TRACE_LIMIT`] bytes and the original size is recorded.

use crate::{Millis, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bytes of a failure message kept on the run.
pub const MESSAGE_LIMIT: usize = 16 * 1024;
/// Bytes of a stack trace kept on the run.
pub const STACK_TRACE_LIMIT: usize = 64 * 1024;

/// A worker's failure report for a workflow task (DW's `failure` object: `message`, `type`,
/// `reason`, `sequence`, `stack_trace`).
#[derive(Clone, Debug, Default)]
pub struct WorkflowTaskFailure {
    pub message: String,
    pub failure_type: Option<String>,
    pub reason: Option<String>,
    /// The workflow sequence the worker was replaying when it failed, if it said.
    pub sequence: Option<u64>,
    pub stack_trace: Option<String>,
}

/// The latest failure of the run's workflow task, with how long it has been failing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskFailureNote {
    pub task_id: TaskId,
    /// The failed lease's `workflow_task_attempt`.
    pub attempt: u64,
    pub lease_owner: String,
    pub failed_at: Millis,
    /// When the current streak of failures began.
    pub first_failed_at: Millis,
    /// Failures in a row since a workflow task last completed.
    pub consecutive: u32,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_trace: Option<String>,
    /// Original byte sizes of the fields cut to their limits (empty when nothing was cut).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub truncated: BTreeMap<String, usize>,
}

impl TaskFailureNote {
    /// The note for `failure`, continuing the streak of `previous` (the run's last note).
    pub fn new(
        failure: WorkflowTaskFailure,
        task_id: &TaskId,
        attempt: u64,
        owner: &str,
        now: Millis,
        previous: Option<&TaskFailureNote>,
    ) -> Self {
        let mut truncated = BTreeMap::new();
        let message = bounded("message", failure.message, MESSAGE_LIMIT, &mut truncated);
        let stack_trace = failure
            .stack_trace
            .map(|s| bounded("stack_trace", s, STACK_TRACE_LIMIT, &mut truncated));
        TaskFailureNote {
            task_id: task_id.clone(),
            attempt,
            lease_owner: owner.to_string(),
            failed_at: now,
            first_failed_at: previous.map_or(now, |p| p.first_failed_at),
            consecutive: previous.map_or(1, |p| p.consecutive.saturating_add(1)),
            message,
            failure_type: failure.failure_type,
            reason: failure.reason,
            sequence: failure.sequence,
            stack_trace,
            truncated,
        }
    }
}

/// `text` cut to at most `limit` bytes on a character boundary; a cut is recorded by field name.
fn bounded(field: &str, mut text: String, limit: usize, truncated: &mut BTreeMap<String, usize>) -> String {
    if text.len() <= limit {
        return text;
    }
    truncated.insert(field.to_string(), text.len());
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(message: String, stack: Option<String>) -> WorkflowTaskFailure {
        WorkflowTaskFailure {
            message,
            stack_trace: stack,
            ..WorkflowTaskFailure::default()
        }
    }

    #[test]
    fn a_streak_counts_from_its_first_failure() {
        let task = TaskId("t".into());
        let first = TaskFailureNote::new(failure("a".into(), None), &task, 1, "w", 10, None);
        let second = TaskFailureNote::new(failure("b".into(), None), &task, 2, "w", 20, Some(&first));
        assert_eq!((first.consecutive, first.first_failed_at), (1, 10));
        assert_eq!((second.consecutive, second.first_failed_at, second.failed_at), (2, 10, 20));
        assert!(second.truncated.is_empty());
    }

    #[test]
    fn long_fields_are_cut_on_a_character_boundary_and_their_sizes_kept() {
        let message = "é".repeat(MESSAGE_LIMIT); // two bytes each
        let stack = "x".repeat(STACK_TRACE_LIMIT + 5);
        let note = TaskFailureNote::new(failure(message, Some(stack)), &TaskId("t".into()), 1, "w", 0, None);
        assert_eq!(note.message.len(), MESSAGE_LIMIT);
        assert_eq!(note.stack_trace.as_ref().map(String::len), Some(STACK_TRACE_LIMIT));
        assert_eq!(note.truncated.get("message"), Some(&(2 * MESSAGE_LIMIT)));
        assert_eq!(note.truncated.get("stack_trace"), Some(&(STACK_TRACE_LIMIT + 5)));
        let odd = "a".to_string() + &"é".repeat(MESSAGE_LIMIT / 2);
        let cut = TaskFailureNote::new(failure(odd, None), &TaskId("t".into()), 1, "w", 0, None);
        assert_eq!(cut.message.len(), MESSAGE_LIMIT - 1, "the split character is dropped whole");
    }
}
