//! A `durable-workflow.v2.history-export` bundle read for import: its integrity checked as DW's
//! bundle verifier checks it (the `json-recursive-ksort-v1` SHA-256 over everything but
//! `integrity`, and the HMAC signature when a key is given), then its run read into the
//! engine's `ImportedRun`. Every problem is a named finding, so a refused import says exactly
//! why; nothing here writes.

use super::fields::Fields;
use capstan_engine::import::{Finding, ImportStamp, ImportedEvent, ImportedRun, InFlight, BUNDLE_SCHEMA, CONTRACT_VERSION, IMPORT_SOURCE};
use capstan_engine::{payload, ClosedReason, CommandId, EventId, EventType, Limits, Millis, RunId, RunStatus, TaskId, WorkflowId};
use serde_json::{json, Map, Value};

pub const CANONICALIZATION: &str = "json-recursive-ksort-v1";
const VERIFICATION_SCHEMA: &str = "durable-workflow.v2.history-bundle-verification";
/// The sections every bundle carries, and whether each is an object (else a list).
const SECTIONS: [(&str, bool); 14] = [
    ("workflow", true),
    ("payloads", true),
    ("history_events", false),
    ("commands", false),
    ("signals", false),
    ("updates", false),
    ("tasks", false),
    ("activities", false),
    ("timers", false),
    ("failures", false),
    ("links", true),
    ("redaction", true),
    ("codec_schemas", true),
    ("payload_manifest", true),
];
/// Where Capstan's export carries an open run's state (beside DW's sections; the checksum
/// covers it like the rest).
pub const CARRIED_STATE: &str = "capstan_run_state";
/// Keys that name payload bytes kept outside the bundle (in the source's object store).
const EXTERNAL_KEYS: [&str; 2] = [payload::RUNTIME_REFERENCE_KEY, payload::DIRECT_REFERENCE_KEY];

/// The bundle's integrity as checked: DW's verification report (`status`, `integrity`,
/// `findings`), and the checksum when it matched.
pub struct Integrity {
    pub report: Value,
    pub errors: Vec<Finding>,
    pub verified_checksum: Option<String>,
}

/// `hex(SHA-256(canonical bundle without integrity))`.
pub fn checksum(bundle: &Map<String, Value>) -> String {
    sha256_hex(&unsigned_canonical(bundle))
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// What the checksum and the signature are taken over: the bundle without its `integrity`.
fn unsigned_canonical(bundle: &Map<String, Value>) -> String {
    crate::canonical::canonical_object_without(bundle, "integrity")
}

/// Checks the bundle's schema, sections and integrity block. `signing_key`: verify the HMAC
/// signature with it; `require_signature`: refuse a bundle whose signature is not verified.
pub fn verify(bundle: &Map<String, Value>, signing_key: Option<&str>, require_signature: bool) -> Integrity {
    let mut errors = Vec::new();
    match bundle.get("schema").and_then(Value::as_str) {
        Some(BUNDLE_SCHEMA) => {}
        Some(other) => errors.push(Finding::new(
            "bundle.schema_unexpected",
            format!(
                "Bundle schema [{other}] does not match expected [{BUNDLE_SCHEMA}] (v1 histories and other formats are not importable)."
            ),
        )),
        None => errors.push(Finding::new("bundle.schema_missing", "Bundle is missing the schema field.")),
    }
    match bundle.get("schema_version").and_then(Value::as_i64) {
        Some(1) => {}
        Some(other) => errors.push(Finding::new(
            "bundle.schema_version_unsupported",
            format!("Bundle schema_version {other} is not importable; this contract takes version 1."),
        )),
        None => errors.push(Finding::new("bundle.schema_version_missing", "Bundle is missing schema_version.")),
    }
    for (section, object) in SECTIONS {
        match bundle.get(section) {
            None => errors.push(Finding::new(
                "bundle.section_missing",
                format!("Bundle is missing required section [{section}]."),
            )),
            // PHP writes an empty object as `[]`.
            Some(Value::Object(_)) if object => {}
            Some(Value::Array(items)) if !object || items.is_empty() => {}
            Some(_) => errors.push(Finding::new(
                "bundle.section_invalid",
                format!(
                    "Bundle section [{section}] must be {}.",
                    if object { "an object" } else { "a list" }
                ),
            )),
        }
    }
    // Written once: the checksum and the signature are both taken over it.
    let unsigned = unsigned_canonical(bundle);
    let recomputed = sha256_hex(&unsigned);
    let recorded = bundle.get("integrity").and_then(Value::as_object);
    let text = |key: &str| recorded.and_then(|i| i.get(key)).and_then(Value::as_str).map(str::to_string);
    let (expected, signature) = (text("checksum"), text("signature"));
    let mut matches = None;
    let mut signature_verified = None;
    match recorded {
        None => errors.push(Finding::new(
            "integrity.missing",
            "Bundle has no integrity block; its contents cannot be vouched for.",
        )),
        Some(_) if text("canonicalization").as_deref() != Some(CANONICALIZATION) => errors.push(Finding::new(
            "integrity.canonicalization_unsupported",
            format!(
                "Unsupported canonicalization {:?}; only {CANONICALIZATION} is recognized.",
                text("canonicalization")
            ),
        )),
        Some(_) if text("checksum_algorithm").as_deref() != Some("sha256") => errors.push(Finding::new(
            "integrity.checksum_algorithm_unsupported",
            format!(
                "Unsupported checksum algorithm {:?}; only sha256 is recognized.",
                text("checksum_algorithm")
            ),
        )),
        Some(_) => {
            matches = Some(expected.as_deref() == Some(recomputed.as_str()));
            if matches == Some(false) {
                errors.push(Finding::new(
                    "integrity.checksum_mismatch",
                    format!("The recorded checksum {expected:?} does not match the bundle's contents ({recomputed})."),
                ));
            }
            if let (Some(key), Some(signature)) = (signing_key, signature.as_deref()) {
                let verified = hmac_hex(key, &unsigned) == signature.to_ascii_lowercase();
                signature_verified = Some(verified);
                if !verified {
                    errors.push(Finding::new(
                        "integrity.signature_mismatch",
                        "The HMAC signature does not verify with the given signing key.",
                    ));
                }
            }
        }
    }
    if require_signature && signature_verified != Some(true) {
        errors.push(Finding::new(
            "bundle.signature_required",
            "A verified history-export signature is required for this import (give signing_key).",
        ));
    }
    let report = json!({
        "schema": VERIFICATION_SCHEMA,
        "schema_version": 1,
        "status": if errors.is_empty() { "ok" } else { "failed" },
        "integrity": {
            "present": recorded.is_some(),
            "canonicalization": text("canonicalization"),
            "checksum_algorithm": text("checksum_algorithm"),
            "expected_checksum": expected,
            "recomputed_checksum": recomputed,
            "checksum_matches": matches,
            "signature_algorithm": text("signature_algorithm"),
            "signature_present": signature.is_some(),
            "signature_verified": signature_verified,
            "key_id": text("key_id"),
        },
        "findings": errors.iter().map(|f| json!({"rule": f.rule, "severity": "error", "message": f.message})).collect::<Vec<_>>(),
    });
    let verified_checksum = errors.is_empty().then_some(recomputed);
    Integrity {
        report,
        errors,
        verified_checksum,
    }
}

fn hmac_hex(key: &str, text: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The bundle's run, read into the engine's terms for `namespace`, with what was in flight; or
/// every finding that stops it being read.
pub fn read_run(
    bundle: &Map<String, Value>,
    namespace: &str,
    checksum: &str,
    limits: &Limits,
) -> Result<(ImportedRun, InFlight), Vec<Finding>> {
    let mut errors = Vec::new();
    let empty = Map::new();
    let object = |key: &str| bundle.get(key).and_then(Value::as_object).unwrap_or(&empty);
    let workflow = object("workflow");
    let text = |key: &str| {
        workflow
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let instance_id = text("instance_id");
    match &instance_id {
        None => errors.push(Finding::new(
            "workflow.instance_id_missing",
            "Bundle workflow.instance_id is required.",
        )),
        Some(id) if !capstan_app::control::valid_workflow_id(id) => errors.push(Finding::new(
            "workflow.instance_id_invalid",
            format!("workflow.instance_id {id:?} is not a workflow id here: 1 to 128 letters, digits, '.', '_', ':' and '-'."),
        )),
        Some(_) => {}
    }
    let run_id = text("run_id");
    match &run_id {
        None => errors.push(Finding::new("workflow.run_id_missing", "Bundle workflow.run_id is required.")),
        Some(id) if id.len() > 64 => errors.push(Finding::new(
            "workflow.run_id_invalid",
            "workflow.run_id is longer than 64 characters.",
        )),
        Some(_) => {}
    }
    let workflow_type = text("workflow_type");
    if workflow_type.is_none() {
        errors.push(Finding::new(
            "workflow.workflow_type_missing",
            "Bundle workflow.workflow_type is required.",
        ));
    }
    let status = text("status").and_then(|s| RunStatus::parse(&s));
    if status.is_none() {
        errors.push(Finding::new(
            "workflow.status_unsupported",
            "Bundle workflow.status is not a supported v2 run status.",
        ));
    }
    let closed_reason = match text("closed_reason") {
        None => None,
        Some(reason) => match ClosedReason::parse(&reason) {
            Some(reason) => Some(reason),
            None => {
                errors.push(Finding::new(
                    "workflow.closed_reason_unsupported",
                    format!("workflow.closed_reason {reason:?} is not a v2 closed reason."),
                ));
                None
            }
        },
    };
    let run_number = match workflow.get("run_number") {
        None | Some(Value::Null) => 1,
        Some(n) => match n.as_u64().filter(|n| (1..=u32::MAX as u64).contains(n)) {
            Some(n) => n as u32,
            None => {
                errors.push(Finding::new(
                    "workflow.run_number_invalid",
                    "workflow.run_number must be a positive integer.",
                ));
                1
            }
        },
    };
    let started_at = text("started_at").and_then(|t| instant(&t, "workflow.started_at", &mut errors));
    let (input, output) = run_payloads(object("payloads"), limits, &mut errors);
    let events = read_events(bundle.get("history_events"), &mut errors);
    refuse_external_payloads(bundle, &mut errors);
    let sections = super::bundle_sections::read(bundle, limits, &mut errors);
    let carried_state = match bundle.get(CARRIED_STATE) {
        None | Some(Value::Null) => None,
        Some(state) => match serde_json::from_value::<capstan_engine::RunState>(state.clone()) {
            Ok(state) => Some(Box::new(state)),
            Err(problem) => {
                errors.push(Finding::new(
                    "capstan_run_state.invalid",
                    format!("{CARRIED_STATE} is not a Capstan run state: {problem}."),
                ));
                None
            }
        },
    };
    let links = object("links");
    let continued_from_run_id = links
        .get("continued_from_run_id")
        .and_then(Value::as_str)
        .map(|id| RunId(id.into()));
    let in_flight = InFlight {
        history_complete: bundle.get("history_complete") == Some(&Value::Bool(true)),
        leased_tasks: list(bundle.get("tasks"))
            .filter(|t| t.get("status").and_then(Value::as_str) == Some("leased"))
            .count(),
        running_attempts: list(bundle.get("activities"))
            .flat_map(|a| list(a.get("attempts")))
            .filter(|a| a.get("status").and_then(Value::as_str) == Some("running"))
            .count(),
        redacted_paths: object("redaction")
            .get("paths")
            .and_then(Value::as_array)
            .map(|paths| {
                paths
                    .iter()
                    .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    };
    let (Some(instance_id), Some(run_id), Some(workflow_type), Some(status), Some(input), true) =
        (instance_id, run_id, workflow_type, status, input, errors.is_empty())
    else {
        return Err(errors);
    };
    let run = ImportedRun {
        namespace: namespace.to_string(),
        workflow_id: WorkflowId(instance_id),
        run_id: RunId(run_id),
        run_number,
        workflow_type,
        task_queue: text("queue").or_else(|| text("task_queue")).unwrap_or_else(|| "default".into()),
        status,
        closed_reason,
        input,
        output,
        business_key: text("business_key"),
        memo: object_or_empty(workflow.get("memo")),
        search_attributes: object_or_empty(workflow.get("search_attributes")),
        compatibility: text("compatibility"),
        started_at,
        is_current_run: workflow.get("is_current_run") == Some(&Value::Bool(true)),
        continued_from_run_id,
        events,
        stamp: ImportStamp {
            source: IMPORT_SOURCE.into(),
            import_id: String::new(),
            dedupe_key: bundle.get("dedupe_key").and_then(Value::as_str).unwrap_or_default().to_string(),
            contract_version: CONTRACT_VERSION,
            imported_at: 0,
            source_runtime: text("source_runtime").unwrap_or_default(),
            bundle_checksum: checksum.to_string(),
            source_namespace: text("namespace"),
            imported_by: None,
        },
        carried_state,
        sections,
    };
    Ok((run, in_flight))
}

fn list(value: Option<&Value>) -> impl Iterator<Item = &Map<String, Value>> {
    value.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object)
}

/// An object, or PHP's `[]` for an empty one.
fn object_or_empty(value: Option<&Value>) -> Map<String, Value> {
    value.and_then(Value::as_object).cloned().unwrap_or_default()
}

fn instant(text: &str, at: &str, errors: &mut Vec<Finding>) -> Option<Millis> {
    let parsed = capstan_engine::schedule::parse_instant(text);
    if parsed.is_none() {
        errors.push(Finding::new(
            "bundle.timestamp_invalid",
            format!("{at} {text:?} is not an RFC 3339 time."),
        ));
    }
    parsed
}

/// The run's input and output: DW writes the blob as `data` with the codec beside it, Capstan
/// writes an `{codec, blob}` envelope; only Avro is a durable payload.
fn run_payloads(
    payloads: &Map<String, Value>,
    limits: &Limits,
    errors: &mut Vec<Finding>,
) -> (Option<capstan_engine::Payload>, Option<capstan_engine::Payload>) {
    if let Some(codec) = payloads.get("codec").and_then(Value::as_str).filter(|c| *c != payload::AVRO_CODEC) {
        errors.push(Finding::new(
            "payload_codec.unsupported",
            format!("Bundle payload codec at [payloads.codec] must be \"avro\"; found {codec:?}."),
        ));
    }
    let mut read = |key: &str| -> Option<capstan_engine::Payload> {
        let section = payloads.get(key).and_then(Value::as_object)?;
        if section.get("available") != Some(&Value::Bool(true)) {
            return None;
        }
        let fields = Fields::nested(section, format!("payloads.{key}."));
        match fields.opt_payload("data", limits) {
            Ok(payload) => payload,
            Err(error) => {
                errors.push(Finding::new("payloads.invalid", format!("payloads.{key}.data: {}", error.message)));
                None
            }
        }
    };
    let input = read("arguments").or_else(|| Some(capstan_engine::Payload::avro(crate::avro::empty_arguments_blob())));
    let output = read("output");
    (input, output)
}

fn read_events(events: Option<&Value>, errors: &mut Vec<Finding>) -> Vec<ImportedEvent> {
    let Some(events) = events.and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut read = Vec::with_capacity(events.len());
    for (index, event) in events.iter().enumerate() {
        let at = format!("history_events[{index}]");
        let Some(event) = event.as_object() else {
            errors.push(Finding::new("history_events.entry_invalid", format!("{at} must be an object.")));
            continue;
        };
        let text = |key: &str| event.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        let type_name = text("type").or_else(|| text("event_type"));
        let event_type = type_name.and_then(EventType::parse);
        if event_type.is_none() {
            errors.push(Finding::new(
                "history_events.type_unknown",
                format!("{at} has event type {type_name:?}, which Capstan does not know; nothing was imported."),
            ));
        }
        let sequence = event.get("sequence").and_then(Value::as_u64);
        let id = text("id");
        if sequence.is_none() || id.is_none() {
            errors.push(Finding::new(
                "history_events.entry_invalid",
                format!("{at} needs an id and a sequence."),
            ));
        }
        let recorded_at = match text("recorded_at") {
            Some(time) => instant(time, &format!("{at}.recorded_at"), errors),
            None => {
                errors.push(Finding::new("history_events.entry_invalid", format!("{at} needs recorded_at.")));
                None
            }
        };
        let payload = match event.get("payload") {
            None | Some(Value::Null) => Some(Map::new()),
            Some(Value::Array(items)) if items.is_empty() => Some(Map::new()),
            Some(Value::Object(payload)) => Some(payload.clone()),
            Some(_) => {
                errors.push(Finding::new(
                    "history_events.entry_invalid",
                    format!("{at}.payload must be an object."),
                ));
                None
            }
        };
        if let (Some(event_type), Some(sequence), Some(id), Some(recorded_at), Some(payload)) =
            (event_type, sequence, id, recorded_at, payload)
        {
            read.push(ImportedEvent {
                id: EventId(id.to_string()),
                sequence,
                event_type,
                payload,
                workflow_task_id: text("workflow_task_id").map(|id| TaskId(id.into())),
                workflow_command_id: text("workflow_command_id").map(|id| CommandId(id.into())),
                recorded_at,
            });
        }
    }
    read
}

/// Bytes kept in the source's object store are not in the bundle, and this server cannot
/// fetch them: such a bundle is refused, naming the first place one is referenced. A reference
/// is an envelope (`codec` beside `external_payload` or `external_storage`); memo and search
/// attribute events hold user data, which may look like anything, and are not searched.
fn refuse_external_payloads(bundle: &Map<String, Value>, errors: &mut Vec<Finding>) {
    fn find(value: &Value, path: &mut Vec<String>) -> bool {
        match value {
            Value::Object(map) => {
                if map.get("codec").is_some_and(Value::is_string) {
                    if let Some(key) = EXTERNAL_KEYS.iter().find(|key| map.get(**key).is_some_and(Value::is_object)) {
                        path.push(key.to_string());
                        return true;
                    }
                }
                map.iter().any(|(key, value)| descend(key.clone(), value, path))
            }
            Value::Array(items) => items.iter().enumerate().any(|(i, item)| descend(i.to_string(), item, path)),
            _ => false,
        }
    }
    fn descend(step: String, value: &Value, path: &mut Vec<String>) -> bool {
        path.push(step);
        let found = find(value, path);
        if !found {
            path.pop();
        }
        found
    }
    let user_data = |event: &Value| {
        let kind = event.get("type").or_else(|| event.get("event_type")).and_then(Value::as_str);
        matches!(kind, Some("MemoUpserted" | "SearchAttributesUpserted"))
    };
    let mut path = vec!["payloads".to_string()];
    let mut found = bundle.get("payloads").is_some_and(|value| find(value, &mut path));
    if !found {
        for (index, event) in bundle
            .get("history_events")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            path = vec!["history_events".to_string(), index.to_string()];
            if !user_data(event) && find(event, &mut path) {
                found = true;
                break;
            }
        }
    }
    if found {
        errors.push(Finding::new(
            "payloads.external_storage_unsupported",
            format!(
                "{} references payload bytes in the source's external storage, which an import cannot bring along.",
                path.join(".")
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(mut bundle: Map<String, Value>) -> Map<String, Value> {
        let sum = checksum(&bundle);
        bundle.insert(
            "integrity".into(),
            json!({"canonicalization": CANONICALIZATION, "checksum_algorithm": "sha256", "checksum": sum}),
        );
        bundle
    }

    fn bundle() -> Map<String, Value> {
        let mut bundle = json!({
            "schema": BUNDLE_SCHEMA, "schema_version": 1, "dedupe_key": "r1:2:t", "history_complete": true,
            "workflow": {"instance_id": "moved", "run_id": "r1", "workflow_type": "Greeter", "status": "completed",
                          "source_runtime": "embedded", "queue": "orders", "is_current_run": true, "memo": []},
            "payloads": {"codec": "avro", "arguments": {"available": false, "data": null}, "output": {"available": false}},
            "history_events": [
                {"id": "e1", "sequence": 1, "type": "WorkflowStarted", "recorded_at": "2026-01-01T00:00:00.123456Z", "payload": []},
                {"id": "e2", "sequence": 2, "type": "WorkflowCompleted", "recorded_at": "2026-01-01T00:00:01Z", "payload": {"x": "é/"}},
            ],
            "commands": [], "signals": [], "updates": [], "tasks": [], "activities": [], "timers": [], "failures": [],
            "links": {}, "redaction": {"applied": false, "paths": []}, "codec_schemas": [], "payload_manifest": {"version": 1, "entries": []},
        });
        std::mem::take(bundle.as_object_mut().unwrap())
    }

    fn rules(findings: &[Finding]) -> Vec<&str> {
        findings.iter().map(|f| f.rule.as_str()).collect()
    }

    #[test]
    fn a_sealed_bundle_verifies_and_reads() {
        let bundle = sealed(bundle());
        let integrity = verify(&bundle, None, false);
        assert_eq!(integrity.errors, vec![], "{}", integrity.report);
        assert_eq!(integrity.report["status"], "ok");
        let (run, in_flight) = read_run(&bundle, "default", "sum", &Limits::default()).expect("readable");
        assert_eq!(run.task_queue, "orders");
        assert_eq!(run.events.len(), 2);
        assert_eq!(run.events[0].recorded_at, 1_767_225_600_123);
        assert!(in_flight.history_complete);
        assert_eq!(run.stamp.bundle_checksum, "sum");
    }

    #[test]
    fn a_changed_bundle_fails_its_checksum_and_a_wrong_key_its_signature() {
        let mut bundle = sealed(bundle());
        bundle["dedupe_key"] = json!("forged");
        assert_eq!(rules(&verify(&bundle, None, false).errors), ["integrity.checksum_mismatch"]);
        let mut signed = sealed(self::bundle());
        let signature = hmac_hex("k1", &unsigned_canonical(&signed));
        signed["integrity"]["signature"] = json!(signature);
        assert_eq!(verify(&signed, Some("k1"), true).errors, vec![]);
        assert_eq!(
            rules(&verify(&signed, Some("k2"), true).errors),
            ["integrity.signature_mismatch", "bundle.signature_required"]
        );
        assert_eq!(rules(&verify(&signed, None, true).errors), ["bundle.signature_required"]);
        let mut unsealed = self::bundle();
        unsealed.remove("tasks");
        assert_eq!(
            rules(&verify(&unsealed, None, false).errors),
            ["bundle.section_missing", "integrity.missing"]
        );
    }

    #[test]
    fn unknown_events_and_external_payloads_are_refused_by_name() {
        let mut bundle = bundle();
        bundle["history_events"][1]["type"] = json!("WorkflowExploded");
        bundle["history_events"][0]["payload"] = json!({"result": {"codec": "avro", "external_storage": {"uri": "s3://x"}}});
        let errors = read_run(&bundle, "default", "sum", &Limits::default()).expect_err("refused");
        assert_eq!(
            rules(&errors),
            ["history_events.type_unknown", "payloads.external_storage_unsupported"]
        );
        assert!(
            errors[1].message.starts_with("history_events.0.payload.result.external_storage"),
            "{errors:?}"
        );
    }

    /// User metadata that merely looks like a payload reference is data, not a reference.
    #[test]
    fn memos_that_look_like_references_are_kept() {
        let mut bundle = bundle();
        let lookalike = json!({"codec": "customer-codec", "external_storage": {"uri": "mine"}});
        bundle["history_events"][0]["type"] = json!("MemoUpserted");
        bundle["history_events"][0]["payload"] = json!({"entries": {"meta": lookalike}});
        bundle["workflow"]["memo"] = json!({"meta": {"payload_codec": "customer-codec"}});
        let (run, _) = read_run(&bundle, "default", "sum", &Limits::default()).expect("readable");
        assert_eq!(run.memo["meta"]["payload_codec"], "customer-codec");
    }
}
