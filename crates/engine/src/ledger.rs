//! The recovery ledger: evidence about consequential actions, beside the history.
//!
//! An operator declares an activity type consequential with an [`ActionDefinition`]. Every
//! dispatch of such an activity to a worker gets a [`LedgerEntry`] committed in the claim
//! transaction, before the worker sees the task. The entry holds hashes and ids only, never the
//! input, payloads or credentials. A verified result closes it; anything that leaves the
//! provider's effect in doubt after dispatch (the worker's exception, a lost lease, a timeout)
//! makes it `outcome_unknown`: the step is not retried and the workflow waits until an operator
//! records evidence (`effect_confirmed` or `effect_absent`). Every state change is a checkpoint
//! in a per-instance hash chain.

use crate::canonical::{self, Member};
use crate::history::GENESIS_HASH;
use crate::{ActivityAttemptId, ActivityExecutionId, Millis, RunId, WorkflowId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// How a declared action can be recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryMode {
    NonAtomic,
    Atomic,
    SnapshotRestore,
    Irreversible,
    LinkedRun,
}

impl RecoveryMode {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "non_atomic" => Self::NonAtomic,
            "atomic" => Self::Atomic,
            "snapshot_restore" => Self::SnapshotRestore,
            "irreversible" => Self::Irreversible,
            "linked_run" => Self::LinkedRun,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NonAtomic => "non_atomic",
            Self::Atomic => "atomic",
            Self::SnapshotRestore => "snapshot_restore",
            Self::Irreversible => "irreversible",
            Self::LinkedRun => "linked_run",
        }
    }

    /// Modes whose dispatch goes to an external worker and is ledgered. `atomic` runs inside
    /// the transaction that records its result, so its outcome is never in doubt.
    pub fn is_ledgered(self) -> bool {
        self != Self::Atomic
    }
}

/// A namespace's declaration that one activity type is a consequential action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActionDefinition {
    pub namespace: String,
    pub activity_type: String,
    pub version: u32,
    pub recovery_mode: RecoveryMode,
    /// The declared document (verification, pending, pins, preview, idempotency key), as given.
    pub document: Map<String, Value>,
    /// SHA-256 of the canonical JSON of `{activity_type, document}`.
    pub definition_hash: String,
    pub updated_at: Millis,
}

impl ActionDefinition {
    /// The hash a definition with this content has (key order does not matter).
    pub fn hash_of(activity_type: &str, document: &Map<String, Value>) -> String {
        let canonical = canonical::object(vec![
            ("activity_type", Member::Value(activity_type.into())),
            ("document", Member::Object(document)),
        ]);
        hex(Sha256::digest(canonical.as_bytes()).as_slice())
    }
}

/// What scheduling pinned: the definition an activity execution must still match at dispatch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionPin {
    pub definition_hash: String,
    pub version: u32,
    pub recovery_mode: RecoveryMode,
    /// The definition's `verification` block, which a result must pass.
    #[serde(default)]
    pub verification: Option<Value>,
    /// Set when the arguments lack what the mode requires (`approval_required`,
    /// `backup_required`): the activity fails at its claim without dispatch.
    #[serde(default)]
    pub refused: Option<String>,
    /// Hash of the pinned approval or backup reference.
    #[serde(default)]
    pub reference_hash: Option<String>,
    /// How a pending or retryable provider result is recognised (`{pointer, values}`).
    #[serde(default)]
    pub pending: Option<Value>,
    /// Seconds between polls of a pending result.
    #[serde(default)]
    pub poll_interval_seconds: Option<i64>,
    /// The provider's idempotency key read from the arguments (the definition's
    /// `idempotency_key` pointer); `None`: the `activity_execution_id` is the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Hash of the canonical preview (the definition's `preview` pointer into the arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_hash: Option<String>,
    /// The probe asked when a dispatch's outcome becomes unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::ledger_probe::ProbeSpec>,
}

impl From<&ActionDefinition> for ActionPin {
    fn from(definition: &ActionDefinition) -> Self {
        Self {
            definition_hash: definition.definition_hash.clone(),
            version: definition.version,
            recovery_mode: definition.recovery_mode,
            verification: definition.document.get("verification").cloned(),
            refused: None,
            reference_hash: None,
            pending: definition.document.get("pending").cloned(),
            poll_interval_seconds: definition.document.get("poll_interval_seconds").and_then(Value::as_i64),
            idempotency_key: None,
            preview_hash: None,
            probe: crate::ledger_probe::ProbeSpec::of(&definition.document),
        }
    }
}

/// Where a definition points into the arguments for a field (`idempotency_key`, `preview`).
fn argument_pointer<'d>(definition: &'d ActionDefinition, field: &str) -> Option<&'d str> {
    definition.document.get(field).and_then(Value::as_str)
}

/// Why a dispatch was refused, as the activity's failure message says it.
pub fn refusal_message(reason: &str) -> &'static str {
    match reason {
        "approval_required" => "approval_required: an irreversible action needs an approval reference (approval_ref) in its arguments; it was not dispatched.",
        "backup_required" => "backup_required: a snapshot-restore action needs a backup reference (backup_ref) in its arguments; it was not dispatched.",
        "idempotency_key_required" => "idempotency_key_required: the action's definition reads the provider's idempotency key from its arguments (idempotency_key), and they do not hold one; it was not dispatched.",
        _ => "preview_required: the action's definition declares a preview of its effect (preview) that its arguments do not hold; it was not dispatched.",
    }
}

impl ActionPin {
    /// The pin of `definition` for an activity whose decoded argument list is `arguments`
    /// (`None`: they could not be read). `irreversible` needs an approval reference and
    /// `snapshot_restore` a backup reference in the arguments, where the definition's `pins`
    /// say (a JSON pointer; by default the first argument's `approval_ref` / `backup_ref`).
    pub fn for_arguments(definition: &ActionDefinition, arguments: Option<&Value>) -> Self {
        let mut pin = Self::from(definition);
        let at = |pointer: &str| arguments.and_then(|args| args.pointer(pointer)).filter(|v| !v.is_null());
        // The provider's key and the preview the definition points at: without them the
        // dispatch could not be reconciled or shown, so it is refused before it happens.
        if let Some(pointer) = argument_pointer(definition, "idempotency_key") {
            match at(pointer).and_then(|key| {
                key.as_str()
                    .map(str::to_string)
                    .or_else(|| key.is_number().then(|| key.to_string()))
            }) {
                Some(key) if !key.trim().is_empty() => pin.idempotency_key = Some(key),
                _ => pin.refused = Some("idempotency_key_required".into()),
            }
        }
        if let Some(pointer) = argument_pointer(definition, "preview") {
            match at(pointer) {
                Some(preview) => pin.preview_hash = Some(digest(&canonical::to_string(preview))),
                None => pin.refused = pin.refused.or(Some("preview_required".into())),
            }
        }
        if pin.refused.is_some() {
            return pin;
        }
        let (field, refusal) = match definition.recovery_mode {
            RecoveryMode::Irreversible => ("approval_ref", "approval_required"),
            RecoveryMode::SnapshotRestore => ("backup_ref", "backup_required"),
            _ => return pin,
        };
        let pointer = definition
            .document
            .get("pins")
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("/0/{field}"));
        let reference = arguments
            .and_then(|args| args.pointer(&pointer))
            .filter(|v| v.as_str().is_some_and(|s| !s.trim().is_empty()) || v.is_number());
        match reference {
            Some(reference) => pin.reference_hash = Some(digest(&reference.to_string())),
            None => pin.refused = Some(refusal.to_string()),
        }
        pin
    }

    /// A pin made at the claim (the definition came after scheduling): arguments are not read
    /// there, so a mode that needs a reference is refused.
    pub fn at_claim(definition: &ActionDefinition) -> Self {
        let mut pin = Self::from(definition);
        pin.refused = match definition.recovery_mode {
            RecoveryMode::Irreversible => Some("approval_required".into()),
            RecoveryMode::SnapshotRestore => Some("backup_required".into()),
            _ if argument_pointer(definition, "idempotency_key").is_some() => Some("idempotency_key_required".into()),
            _ if argument_pointer(definition, "preview").is_some() => Some("preview_required".into()),
            _ => None,
        };
        pin
    }
}

/// Seconds between polls when a definition does not say.
pub const POLL_INTERVAL_DEFAULT_SECONDS: i64 = 30;

/// What a ledgered action's decoded result means.
#[derive(Clone, Debug, PartialEq)]
pub enum ResultClass {
    /// Verified and final: record it.
    Conclusive,
    /// Not yet: poll again after `interval_seconds`.
    Pending { interval_seconds: i64 },
    /// A linked run that failed: a final, non-retryable failure of the step.
    LinkedRunFailed,
    /// The effect is in doubt (`invalid_result`, `unknown_publication`): an operator decides.
    Unknown(Value),
}

/// Classifies a ledgered action's result. `linked_run` results are run descriptors (`status`:
/// `running`, `succeeded`, `failed`, `unknown_publication`); for other modes the definition's
/// `pending` (`{pointer, values}`) says which results mean "not yet", and `verification`
/// decides whether the rest is conclusive.
pub fn classify_result(pin: &ActionPin, result: &Value) -> ResultClass {
    let interval_seconds = pin.poll_interval_seconds.unwrap_or(POLL_INTERVAL_DEFAULT_SECONDS).max(1);
    if pin.recovery_mode == RecoveryMode::LinkedRun {
        match result.get("status").and_then(Value::as_str) {
            Some("running") => return ResultClass::Pending { interval_seconds },
            Some("failed") => return ResultClass::LinkedRunFailed,
            Some("unknown_publication") => {
                return ResultClass::Unknown(json!({"kind": "unknown_publication", "descriptor_status": "unknown_publication"}))
            }
            Some("succeeded") => {}
            _ => {
                return ResultClass::Unknown(json!({"kind": "invalid_result",
                    "problems": ["a linked run's result must be a descriptor with status running, succeeded, failed or unknown_publication"]}))
            }
        }
    } else if let Some(pending) = &pin.pending {
        let pointer = pending.get("pointer").and_then(Value::as_str).unwrap_or("/status");
        let values = pending.get("values").and_then(Value::as_array);
        if let (Some(found), Some(values)) = (result.pointer(pointer), values) {
            if values.contains(found) {
                return ResultClass::Pending { interval_seconds };
            }
        }
    }
    match pin.verification.as_ref().map(|v| check_result(v, result)) {
        Some(Err(problems)) => ResultClass::Unknown(json!({"kind": "invalid_result", "problems": problems})),
        _ => ResultClass::Conclusive,
    }
}

/// Checks a result against a definition's `verification`: `result_schema` (a JSON-schema
/// subset: `type`, `properties`, `required`, `enum`, `const`, `items`, `additionalProperties:
/// false`) and `declared_effects` (a result object's `effects` list, of kinds or `{kind}`
/// objects, may only announce those). Returns what failed.
pub fn check_result(verification: &Value, result: &Value) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if let Some(schema) = verification.get("result_schema") {
        check_schema(schema, result, "$", &mut problems);
    }
    let announced: Vec<String> = result
        .get("effects")
        .and_then(Value::as_array)
        .map(|effects| {
            effects
                .iter()
                .filter_map(|e| e.as_str().or_else(|| e.get("kind").and_then(Value::as_str)))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let declared: Vec<&str> = verification
        .get("declared_effects")
        .and_then(Value::as_array)
        .map(|d| d.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for effect in announced.iter().filter(|e| !declared.contains(&e.as_str())) {
        problems.push(format!("the result announces an undeclared effect {effect:?}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        _ => false,
    }
}

fn check_schema(schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    if let Some(expected) = schema.get("type") {
        let ok = match expected {
            Value::String(t) => type_matches(t, value),
            Value::Array(types) => types.iter().filter_map(Value::as_str).any(|t| type_matches(t, value)),
            _ => true,
        };
        if !ok {
            problems.push(format!("{at}: expected type {expected}"));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            problems.push(format!("{at}: not one of the allowed values"));
        }
    }
    if let Some(constant) = schema.get("const") {
        if constant != value {
            problems.push(format!("{at}: must equal {constant}"));
        }
    }
    if let Some(object) = value.as_object() {
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(name) {
                problems.push(format!("{at}: missing required property {name:?}"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, item) in object {
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => check_schema(sub, item, &format!("{at}.{name}"), problems),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    problems.push(format!("{at}: unexpected property {name:?}"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (index, item) in array.iter().enumerate() {
            check_schema(items, item, &format!("{at}[{index}]"), problems);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerState {
    /// Handed to a worker; the provider may be acting now.
    Dispatched,
    /// A conclusive result was recorded with the history event.
    Verified,
    /// The effect may or may not have happened: an operator must decide.
    OutcomeUnknown,
    /// An operator recorded that the effect happened.
    EffectConfirmed,
    /// An operator recorded that it did not; one deliberate retry follows.
    EffectAbsent,
    /// The provider answered "not yet" (a pending result, or a linked run still running): the
    /// next poll is a new dispatch with a new entry and the same idempotency key.
    Pending,
}

impl LedgerState {
    pub const ALL: [LedgerState; 6] = [
        Self::Dispatched,
        Self::Verified,
        Self::OutcomeUnknown,
        Self::EffectConfirmed,
        Self::EffectAbsent,
        Self::Pending,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dispatched => "dispatched",
            Self::Verified => "verified",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::EffectConfirmed => "effect_confirmed",
            Self::EffectAbsent => "effect_absent",
            Self::Pending => "pending",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "dispatched" => Self::Dispatched,
            "verified" => Self::Verified,
            "outcome_unknown" => Self::OutcomeUnknown,
            "effect_confirmed" => Self::EffectConfirmed,
            "effect_absent" => Self::EffectAbsent,
            "pending" => Self::Pending,
            _ => return None,
        })
    }
}

/// One provider invocation of a declared action. Hashes and ids only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub ledger_key: String,
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub activity_type: String,
    pub activity_execution_id: ActivityExecutionId,
    pub activity_attempt_id: ActivityAttemptId,
    pub attempt_number: u32,
    /// The attempt's fence when it was dispatched.
    pub fence: u64,
    pub state: LedgerState,
    pub recovery_mode: RecoveryMode,
    pub definition_hash: String,
    pub definition_version: u32,
    pub input_hash: String,
    pub access_context_hash: String,
    pub idempotency_key_hash: String,
    /// Hash of the canonical preview of the effect, when the definition declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_hash: Option<String>,
    pub dispatched_at: Millis,
    pub updated_at: Millis,
    /// Why the outcome is unknown (the worker's report, the lost lease…).
    #[serde(default)]
    pub unknown_reason: Option<Value>,
    /// The operator's decision, evidence and principal.
    #[serde(default)]
    pub resolution: Option<Value>,
    /// Hash of this entry's latest checkpoint in the instance chain.
    pub checkpoint_hash: String,
    /// Reports that arrived after the attempt had lost its lease: refused for the workflow,
    /// kept here as evidence for the operator (hashes and messages, never payloads).
    #[serde(default)]
    pub late_reports: Vec<Value>,
    /// The reconciliation probe asked about this dispatch (its instance id, type, and state:
    /// `dispatched`, then `found`, `absent`, `inconclusive` or `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Value>,
}

/// One state change of a ledger entry, chained per workflow instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerCheckpoint {
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub ledger_key: String,
    pub state: LedgerState,
    pub recorded_at: Millis,
    /// What changed (ids, hashes, reasons; never payloads).
    pub details: Map<String, Value>,
    pub prev_hash: String,
    pub hash: String,
}

impl LedgerCheckpoint {
    /// The canonical form hashed into the chain (keys sorted by [`crate::canonical`]).
    pub fn canonical_json(&self) -> String {
        canonical::object(vec![
            ("details", Member::Object(&self.details)),
            ("ledger_key", Member::Value(self.ledger_key.as_str().into())),
            ("recorded_at", Member::Value(self.recorded_at.into())),
            ("state", Member::Value(self.state.as_str().into())),
            ("workflow_id", Member::Value(self.workflow_id.as_str().into())),
        ])
    }

    pub fn computed_hash(&self) -> String {
        chain(&self.prev_hash, &self.canonical_json())
    }
}

/// `hex(SHA-256(prev ‖ canonical))`, the same construction as the history chain.
pub fn chain(prev: &str, canonical: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(canonical.as_bytes());
    hex(hasher.finalize().as_slice())
}

/// SHA-256 of text, hex encoded: how inputs, keys and access contexts enter the ledger.
pub fn digest(text: &str) -> String {
    hex(Sha256::digest(text.as_bytes()).as_slice())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Verifies a chain of checkpoints from the genesis hash: each links to the previous and hashes
/// to what it claims. Returns the index of the first broken checkpoint.
pub fn verify_checkpoints(checkpoints: &[LedgerCheckpoint]) -> Result<(), usize> {
    let mut prev = GENESIS_HASH.to_string();
    for (index, checkpoint) in checkpoints.iter().enumerate() {
        if checkpoint.prev_hash != prev || checkpoint.computed_hash() != checkpoint.hash {
            return Err(index);
        }
        prev = checkpoint.hash.clone();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_checked_against_the_schema_subset_and_declared_effects() {
        let verification = json!({
            "result_schema": {"type": "object", "required": ["status"], "additionalProperties": false,
                "properties": {"status": {"enum": ["charged", "declined"]}, "amount": {"type": "integer"}, "effects": {"type": "array"}}},
            "declared_effects": ["payment"],
        });
        assert!(check_result(&verification, &json!({"status": "charged", "amount": 5, "effects": ["payment"]})).is_ok());
        let problems = check_result(&verification, &json!({"status": "maybe", "amount": 1.5, "extra": 1})).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        let problems = check_result(&verification, &json!({"status": "charged", "effects": [{"kind": "refund"}]})).unwrap_err();
        assert!(problems[0].contains("undeclared effect"), "{problems:?}");
        assert!(check_result(&json!({}), &json!("anything")).is_ok());
    }

    #[test]
    fn irreversible_actions_need_an_approval_reference_in_their_arguments() {
        let document = json!({"recovery_mode": "irreversible"}).as_object().unwrap().clone();
        let definition = ActionDefinition {
            namespace: "default".into(),
            activity_type: "wipe".into(),
            version: 1,
            recovery_mode: RecoveryMode::Irreversible,
            definition_hash: ActionDefinition::hash_of("wipe", &document),
            document,
            updated_at: 0,
        };
        let approved = ActionPin::for_arguments(&definition, Some(&json!([{"approval_ref": "CAB-42"}])));
        assert!(approved.refused.is_none() && approved.reference_hash.is_some());
        let missing = ActionPin::for_arguments(&definition, Some(&json!([{"target": "db"}])));
        assert_eq!(missing.refused.as_deref(), Some("approval_required"));
        assert_eq!(
            ActionPin::for_arguments(&definition, None).refused.as_deref(),
            Some("approval_required")
        );
        assert_eq!(ActionPin::at_claim(&definition).refused.as_deref(), Some("approval_required"));
    }

    #[test]
    fn definition_hashes_ignore_key_order_and_see_content() {
        let a: Map<String, Value> = serde_json::from_str(r#"{"recovery_mode":"non_atomic","verification":{"x":1}}"#).unwrap();
        let b: Map<String, Value> = serde_json::from_str(r#"{"verification":{"x":1},"recovery_mode":"non_atomic"}"#).unwrap();
        let c: Map<String, Value> = serde_json::from_str(r#"{"verification":{"x":2},"recovery_mode":"non_atomic"}"#).unwrap();
        assert_eq!(ActionDefinition::hash_of("pay", &a), ActionDefinition::hash_of("pay", &b));
        assert_ne!(ActionDefinition::hash_of("pay", &a), ActionDefinition::hash_of("pay", &c));
        assert_ne!(ActionDefinition::hash_of("pay", &a), ActionDefinition::hash_of("refund", &a));
    }

    #[test]
    fn a_tampered_checkpoint_breaks_the_chain() {
        let mut prev = GENESIS_HASH.to_string();
        let mut chain_of = Vec::new();
        for (n, state) in [LedgerState::Dispatched, LedgerState::OutcomeUnknown, LedgerState::EffectConfirmed]
            .into_iter()
            .enumerate()
        {
            let mut checkpoint = LedgerCheckpoint {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                ledger_key: "k".into(),
                state,
                recorded_at: n as i64,
                details: Map::new(),
                prev_hash: prev.clone(),
                hash: String::new(),
            };
            checkpoint.hash = checkpoint.computed_hash();
            prev = checkpoint.hash.clone();
            chain_of.push(checkpoint);
        }
        assert_eq!(verify_checkpoints(&chain_of), Ok(()));
        chain_of[1].state = LedgerState::Verified;
        assert_eq!(verify_checkpoints(&chain_of), Err(1));
    }
}
