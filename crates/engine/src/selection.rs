//! Durable selection (`ctx.select`): a workflow waits for the first of several members
//! (activities, timers, children, or groups of them) to finish.
//!
//! The SDKs send every member as an ordinary step command tagged with a `select` entry in its
//! `parallel_group_path`. The server's part is to name the winner: in the same transaction as
//! the terminal event that first settles any member, it records one `SelectionResolved` for the
//! group, pointing at that event. Losers keep running; their results are recorded as usual, and
//! the workflow may cancel them (`cancel_selection_operation` → `SelectionOperationCancelled`).

use crate::history::EventType;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The selection fields of one select leaf (the `mode: select` entry of its group path).
#[derive(Clone, Debug, PartialEq)]
pub struct SelectEntry {
    pub group_id: String,
    pub base: u64,
    pub size: u64,
    pub member_key: Value,
    pub member_index: u64,
    pub member_base: u32,
    pub member_size: u32,
    pub member_kind: String,
}

fn is_select(entry: &Map<String, Value>) -> bool {
    entry.get("parallel_group_mode").and_then(Value::as_str) == Some("select")
}

impl SelectEntry {
    /// The select entry of an event or command payload: the outermost select entry of its path,
    /// else its top-level fields when they describe a select.
    pub fn of(payload: &Map<String, Value>) -> Option<Self> {
        let from_path = payload
            .get("parallel_group_path")
            .and_then(Value::as_array)
            .and_then(|path| path.iter().filter_map(Value::as_object).find(|e| is_select(e)));
        let entry = from_path.or(Some(payload).filter(|p| is_select(p)))?;
        let number = |key: &str| entry.get(key).and_then(Value::as_u64);
        Some(Self {
            group_id: entry.get("parallel_group_id")?.as_str()?.to_string(),
            base: number("parallel_group_base_sequence")?,
            size: number("parallel_group_size")?,
            member_key: entry.get("selection_member_key")?.clone(),
            member_index: number("selection_member_index")?,
            member_base: number("selection_member_base_sequence")? as u32,
            member_size: number("selection_member_size")? as u32,
            member_kind: entry.get("selection_member_kind")?.as_str()?.to_string(),
        })
    }

    fn steps(&self) -> std::ops::Range<u32> {
        self.member_base..self.member_base + self.member_size
    }
}

/// How a step's terminal event counts for a select member.
fn settles(event_type: EventType, payload: &Map<String, Value>) -> Option<bool> {
    match event_type {
        EventType::ActivityCompleted | EventType::ChildRunCompleted | EventType::SignalApplied => Some(true),
        EventType::ConditionWaitSatisfied | EventType::ConditionWaitTimedOut => Some(true),
        // Only a user timer settles a timer member; a wait's timeout timer settles its wait.
        EventType::TimerFired => Some(true).filter(|_| payload.get("timer_kind").is_none()),
        EventType::ActivityFailed
        | EventType::ActivityCancelled
        | EventType::ActivityTimedOut
        | EventType::ChildRunFailed
        | EventType::ChildRunCancelled
        | EventType::ChildRunTerminated => Some(false),
        _ => None,
    }
}

/// The durable identity an opening event gives its operation, with its precedence (a wait's
/// id outranks the timeout timer opened at the same step).
fn opening_identity(event_type: EventType, payload: &Map<String, Value>) -> Option<(u8, String)> {
    let (rank, key) = match event_type {
        EventType::ConditionWaitOpened => (3, "condition_wait_id"),
        EventType::SignalWaitOpened => (3, "signal_wait_id"),
        EventType::ActivityScheduled => (2, "activity_execution_id"),
        EventType::ChildWorkflowScheduled => (2, "child_workflow_run_id"),
        EventType::TimerScheduled => (1, "timer_id"),
        _ => return None,
    };
    Some((rank, payload.get(key)?.as_str()?.to_string()))
}

/// What the run remembers about its selections.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectionBook {
    /// Each select leaf's operation identity (and its precedence), by step.
    #[serde(default)]
    identities: BTreeMap<u32, (u8, String)>,
    /// Groups whose winner is recorded.
    #[serde(default)]
    resolved: BTreeSet<String>,
    /// Successful leaves of members that are groups, by select group.
    #[serde(default)]
    succeeded: BTreeMap<String, BTreeSet<u32>>,
    /// Steps of members settled or cancelled: a cancel of them is a no-op.
    #[serde(default)]
    settled_steps: BTreeSet<u32>,
    /// `group id|member base` of cancelled members.
    #[serde(default)]
    cancelled: BTreeSet<String>,
}

impl SelectionBook {
    /// Notes an appended event; returns the `SelectionResolved` payload when it settles the
    /// first member of its group.
    pub fn observe(&mut self, event_id: &str, event_type: EventType, payload: &Map<String, Value>) -> Option<Map<String, Value>> {
        let entry = SelectEntry::of(payload)?;
        let step = payload.get("sequence").and_then(Value::as_u64)? as u32;
        if let Some((rank, identity)) = opening_identity(event_type, payload) {
            let slot = self.identities.entry(step).or_insert((0, String::new()));
            if rank >= slot.0 {
                *slot = (rank, identity);
            }
            return None;
        }
        let success = settles(event_type, payload)?;
        self.settled_steps.insert(step);
        if self.resolved.contains(&entry.group_id) {
            return None;
        }
        let member_done = if !success || entry.member_size == 1 {
            true
        } else {
            let done = self.succeeded.entry(entry.group_id.clone()).or_default();
            done.insert(step);
            entry.steps().all(|s| done.contains(&s))
        };
        if !member_done {
            return None;
        }
        self.resolved.insert(entry.group_id.clone());
        self.succeeded.remove(&entry.group_id);
        let identity = if entry.member_kind == "group" {
            format!("group:{}:{}", entry.member_base, entry.member_size)
        } else {
            self.identities
                .get(&entry.member_base)
                .map(|(_, id)| id.clone())
                .unwrap_or_default()
        };
        let mut resolved = Map::new();
        for (key, value) in [
            ("selection_group_id", json!(entry.group_id)),
            ("selection_group_base_sequence", json!(entry.base)),
            ("selection_group_size", json!(entry.size)),
            ("member_key", entry.member_key.clone()),
            ("member_index", json!(entry.member_index)),
            ("member_base_sequence", json!(entry.member_base)),
            ("member_size", json!(entry.member_size)),
            ("operation_kind", json!(entry.member_kind)),
            ("operation_identity", json!(identity)),
            ("outcome", json!(if success { "completed" } else { "failed" })),
            ("resolution_event_id", json!(event_id)),
            ("resolution_event_type", json!(event_type.as_str())),
        ] {
            resolved.insert(key.to_string(), value);
        }
        Some(resolved)
    }

    /// Whether a cancel of this member changes anything: not if every leaf already settled or
    /// the member was cancelled before. Records the cancel when it does.
    pub fn take_cancel(&mut self, group_id: &str, member_base: u32, member_size: u32) -> bool {
        if (member_base..member_base + member_size).all(|s| self.settled_steps.contains(&s)) {
            return false;
        }
        self.cancelled.insert(format!("{group_id}|{member_base}"))
    }

    /// The identity recorded for a member's first step.
    pub fn identity(&self, member_base: u32) -> Option<&str> {
        self.identities.get(&member_base).map(|(_, id)| id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(step: u32, key: &str, index: u64, member_size: u32, kind: &str) -> Map<String, Value> {
        let entry = json!({"parallel_group_id": "select-calls:1:3", "parallel_group_mode": "select",
            "parallel_group_base_sequence": 1, "parallel_group_size": 3, "parallel_group_index": step - 1,
            "selection_member_key": key, "selection_member_index": index,
            "selection_member_base_sequence": if index == 0 { 1 } else { 2 }, "selection_member_size": member_size,
            "selection_member_kind": kind});
        let mut payload = Map::new();
        payload.insert("sequence".into(), json!(step));
        payload.insert("parallel_group_path".into(), json!([entry]));
        payload
    }

    #[test]
    fn the_first_settled_member_wins_once() {
        let mut book = SelectionBook::default();
        let mut scheduled = leaf(1, "work", 0, 1, "activity");
        scheduled.insert("activity_execution_id".into(), json!("A"));
        assert!(book.observe("e1", EventType::ActivityScheduled, &scheduled).is_none());
        let won = book
            .observe("e2", EventType::ActivityCompleted, &leaf(1, "work", 0, 1, "activity"))
            .unwrap();
        assert_eq!(won["operation_identity"], json!("A"));
        assert_eq!(won["resolution_event_id"], json!("e2"));
        assert_eq!(won["outcome"], json!("completed"));
        assert!(
            book.observe("e3", EventType::TimerFired, &leaf(2, "late", 1, 2, "group")).is_none(),
            "one winner"
        );
        assert!(!book.take_cancel("select-calls:1:3", 1, 1), "a settled member needs no cancel");
        assert!(book.take_cancel("select-calls:1:3", 2, 2));
        assert!(!book.take_cancel("select-calls:1:3", 2, 2), "one cancel marker per member");
    }

    #[test]
    fn a_group_member_wins_when_all_its_leaves_succeed_or_one_fails() {
        let mut book = SelectionBook::default();
        assert!(book.observe("e1", EventType::TimerFired, &leaf(2, "pair", 1, 2, "group")).is_none());
        let won = book
            .observe("e2", EventType::ActivityCompleted, &leaf(3, "pair", 1, 2, "group"))
            .unwrap();
        assert_eq!(won["operation_identity"], json!("group:2:2"));
        let mut book = SelectionBook::default();
        let won = book
            .observe("e1", EventType::ActivityFailed, &leaf(3, "pair", 1, 2, "group"))
            .unwrap();
        assert_eq!(won["outcome"], json!("failed"));
    }
}
