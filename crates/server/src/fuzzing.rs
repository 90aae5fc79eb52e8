//! Entry points for fuzzers: each takes arbitrary bytes and must return without panicking,
//! whatever they are. `fuzz/` wraps them as `cargo fuzz` (libFuzzer) targets; the property
//! tests in `tests/fuzz_short.rs` run them on stable in CI.

use capstan_engine::schedule::ParsedSpec;
use capstan_engine::visibility::{parse_filter, AttributeType};
use capstan_engine::Limits;
use serde_json::Value;
use std::collections::BTreeMap;

/// A worker's `commands` list as the completion handler parses it.
pub fn workflow_commands(bytes: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
        let _ = crate::wire::parse_commands(Some(&value), &Limits::default());
        if let Value::Object(map) = &value {
            let _ = crate::wire::parse_activity_failure(map, &Limits::default());
        }
    }
}

/// A DW payload blob (base64 of an Avro `Value` frame) decoded to JSON, and the frame check
/// the hot path runs on every payload.
pub fn payload(bytes: &[u8]) {
    let blob = String::from_utf8_lossy(bytes);
    let _ = crate::avro::is_value_frame(&blob);
    let _ = crate::decode_envelope(&serde_json::json!({"codec": "avro", "blob": blob}));
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let _ = crate::decode_envelope(&serde_json::json!({"codec": "avro", "blob": encoded}));
}

/// A workflow-list query against a schema with every attribute type.
pub fn visibility_query(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let schema: BTreeMap<String, AttributeType> = [
        ("Tier", AttributeType::Keyword),
        ("Note", AttributeType::Text),
        ("Count", AttributeType::Int),
        ("Amount", AttributeType::Double),
        ("Vip", AttributeType::Bool),
        ("Due", AttributeType::Datetime),
        ("Tags", AttributeType::KeywordList),
    ]
    .into_iter()
    .map(|(name, kind)| (name.to_string(), kind))
    .collect();
    let _ = capstan_engine::visibility::looks_like_filter(&text);
    let _ = parse_filter(&text, &schema);
}

/// A schedule spec: the bytes as a cron expression, an interval and a time zone, and the next
/// few occurrences of whatever a create would accept.
pub fn schedule_spec(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes).to_string();
    let specs = [
        serde_json::json!({"cron_expressions": [text.clone()]}),
        serde_json::json!({"intervals": [{"every": text.clone()}]}),
        serde_json::json!({"cron_expressions": ["0 * * * *"], "timezone": text.clone()}),
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
    ];
    for spec in specs {
        if let Value::Object(map) = spec {
            // What a create accepts is what the scheduler evaluates on every pass.
            if let Ok(parsed) = ParsedSpec::parse(&map).and_then(|p| p.check_every_cron_fires(1_800_000_000_000).map(|_| p)) {
                let mut at = 1_800_000_000_000;
                for _ in 0..4 {
                    let Some(next) = parsed.next_after(at) else { break };
                    assert!(next > at, "an occurrence after {at} came at {next}");
                    at = next;
                }
            }
        }
    }
}
