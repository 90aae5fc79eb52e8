//! Command contracts: the queries, signals and updates a workflow type declares.
//!
//! Workers send one contract per workflow type when they register
//! (`workflow_command_contracts`). A run records the contract that was registered when it started
//! (on `WorkflowStarted` as `declared_*`), and admission of signals and updates checks it: a name
//! outside a declaration is refused before anything is recorded.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The handlers one workflow type declares. `*_contracts` are kept verbatim for display.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommandContract {
    #[serde(default)]
    pub queries: Vec<String>,
    #[serde(default)]
    pub query_contracts: Vec<Value>,
    #[serde(default)]
    pub signals: Vec<String>,
    #[serde(default)]
    pub signal_contracts: Vec<Value>,
    #[serde(default)]
    pub updates: Vec<String>,
    #[serde(default)]
    pub update_contracts: Vec<Value>,
    /// Updates with a validator the worker must approve before the update is accepted.
    #[serde(default)]
    pub update_validators: Vec<String>,
}

fn names(entry: &Map<String, Value>, key: &str) -> Vec<String> {
    let mut names: Vec<String> = entry
        .get(key)
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    names.sort();
    names.dedup();
    names
}

fn objects(entry: &Map<String, Value>, key: &str) -> Vec<Value> {
    entry
        .get(key)
        .and_then(Value::as_array)
        .map(|items| items.iter().filter(|v| v.is_object()).cloned().collect())
        .unwrap_or_default()
}

impl CommandContract {
    /// Reads one entry of a registration's `workflow_command_contracts` (an object per workflow
    /// type). Anything that is not an object is no contract.
    pub fn from_registration(entry: &Value) -> Option<Self> {
        let entry = entry.as_object()?;
        Some(Self {
            queries: names(entry, "queries"),
            query_contracts: objects(entry, "query_contracts"),
            signals: names(entry, "signals"),
            signal_contracts: objects(entry, "signal_contracts"),
            updates: names(entry, "updates"),
            update_contracts: objects(entry, "update_contracts"),
            update_validators: names(entry, "update_validators"),
        })
    }

    /// Signals are only a declaration when the list is non-empty: both SDKs register an empty
    /// list for a type whose code waits on signals by name without declaring them (Rust's
    /// `wait_signal`, Python's replayer ignoring unhandled signals), so an empty list admits all.
    pub fn admits_signal(&self, name: &str) -> bool {
        self.signals.is_empty() || self.signals.iter().any(|s| s == name)
    }

    /// Updates are strict: an update needs a handler in the worker, and both SDKs list every
    /// handler, so a name outside the list could only be accepted and then fail.
    pub fn admits_update(&self, name: &str) -> bool {
        self.updates.iter().any(|u| u == name)
    }

    /// Whether an update must pass its validator (a pre-accept validation task) first.
    pub fn validates_update(&self, name: &str) -> bool {
        self.admits_update(name) && self.update_validators.iter().any(|u| u == name)
    }

    /// The `declared_*` fields of `WorkflowStarted` and of run descriptions.
    pub fn declared_fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        let mut put = |key: &str, value: Value| {
            fields.insert(key.to_string(), value);
        };
        put("declared_queries", Value::from(self.queries.clone()));
        put("declared_query_contracts", Value::from(self.query_contracts.clone()));
        put("declared_signals", Value::from(self.signals.clone()));
        put("declared_signal_contracts", Value::from(self.signal_contracts.clone()));
        put("declared_updates", Value::from(self.updates.clone()));
        put("declared_update_contracts", Value::from(self.update_contracts.clone()));
        put("declared_update_validators", Value::from(self.update_validators.clone()));
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_a_registration_entry_and_admits_by_declaration() {
        let contract = CommandContract::from_registration(&json!({
            "queries": ["items"], "signals": ["close", "append", "close"],
            "updates": ["add_item"], "update_contracts": [{"name": "add_item"}, "junk"],
            "update_validators": [],
        }))
        .unwrap();
        assert_eq!(contract.signals, ["append", "close"]);
        assert_eq!(contract.update_contracts, [json!({"name": "add_item"})]);
        assert!(contract.admits_signal("append") && !contract.admits_signal("other"));
        assert!(contract.admits_update("add_item") && !contract.admits_update("other"));
        assert_eq!(contract.declared_fields()["declared_updates"], json!(["add_item"]));
        assert!(!contract.validates_update("add_item"));
        let validated = CommandContract::from_registration(&json!({"updates": ["a", "b"], "update_validators": ["b", "c"]})).unwrap();
        assert!(!validated.validates_update("a") && validated.validates_update("b"));
        assert!(!validated.validates_update("c"), "a validator without an update admits nothing");
    }

    #[test]
    fn an_empty_signal_list_admits_every_signal_but_no_update() {
        let contract = CommandContract::from_registration(&json!({"signals": [], "updates": []})).unwrap();
        assert!(contract.admits_signal("anything"));
        assert!(!contract.admits_update("anything"));
        assert!(CommandContract::from_registration(&json!("nope")).is_none());
    }
}
