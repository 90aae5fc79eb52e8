//! The short form of the fuzz targets (`capstan_server::fuzzing`), on stable in CI: random
//! bytes and grammar-shaped strings. The long form is `cargo fuzz` (see `fuzz/README.md`).

use capstan_server::fuzzing;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("CAPSTAN_FUZZ_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings made of the visibility grammar's own pieces, so parsing goes deep.
fn query_like() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("Tier".to_string()),
        Just("Count".to_string()),
        Just("Amount".to_string()),
        Just("Vip".to_string()),
        Just("Due".to_string()),
        Just("Tags".to_string()),
        Just("Note".to_string()),
        Just("WorkflowType".to_string()),
        Just("ExecutionStatus".to_string()),
        Just("=".to_string()),
        Just("!=".to_string()),
        Just(">=".to_string()),
        Just("<".to_string()),
        Just("AND".to_string()),
        Just("OR".to_string()),
        Just("NOT".to_string()),
        Just("IN".to_string()),
        Just("BETWEEN".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(",".to_string()),
        Just("\"gold\"".to_string()),
        Just("'x'".to_string()),
        Just("42".to_string()),
        Just("-1.5e300".to_string()),
        Just("true".to_string()),
        Just("\"2026-12-01T00:00:00Z\"".to_string()),
        Just("\"".to_string()),
        "[a-zA-Z0-9_ %\\\\\"'()=<>!-]{0,8}",
    ];
    prop::collection::vec(token, 0..16).prop_map(|tokens| tokens.join(" "))
}

fn cron_like() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just("*".to_string()),
        Just("*/15".to_string()),
        Just("0".to_string()),
        Just("59".to_string()),
        Just("1-5".to_string()),
        Just("MON-FRI".to_string()),
        Just("L".to_string()),
        Just("31".to_string()),
        Just("2/0".to_string()),
        "[0-9*/,LW#?-]{1,6}",
    ];
    prop_oneof![
        prop::collection::vec(field, 1..8).prop_map(|fields| fields.join(" ")),
        Just("@daily".to_string()),
        "P[0-9]{0,4}[DTHMS]{0,3}[0-9]{0,3}[HMS]?",
        "[A-Za-z_/+-]{0,24}",
    ]
}

fn command_like() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![
        Just("schedule_activity"),
        Just("start_timer"),
        Just("complete_workflow"),
        Just("fail_workflow"),
        Just("start_child_workflow"),
        Just("continue_as_new"),
        Just("open_signal_wait"),
        Just("record_side_effect"),
        Just("upsert_search_attributes"),
        Just("complete_update"),
        Just("nope"),
    ];
    let value = prop_oneof![
        Just(serde_json::json!(null)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(1e308)),
        Just(serde_json::json!("x")),
        Just(serde_json::json!({"codec": "avro", "blob": "wwE="})),
        Just(serde_json::json!([1, 2])),
        Just(serde_json::json!({})),
    ];
    let field = prop_oneof![
        Just("activity_type"),
        Just("delay_seconds"),
        Just("arguments"),
        Just("result"),
        Just("retry_policy"),
        Just("start_to_close_timeout"),
        Just("heartbeat_timeout"),
        Just("workflow_type"),
        Just("signal_name"),
        Just("message"),
        Just("update_id"),
    ];
    prop::collection::vec((kind, prop::collection::vec((field, value), 0..5)), 0..4).prop_map(|commands| {
        let list: Vec<serde_json::Value> = commands
            .into_iter()
            .map(|(kind, fields)| {
                let mut map = serde_json::Map::new();
                map.insert("type".into(), serde_json::json!(kind));
                for (key, value) in fields {
                    map.insert(key.into(), value);
                }
                serde_json::Value::Object(map)
            })
            .collect();
        serde_json::to_vec(&list).unwrap()
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn workflow_commands_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        fuzzing::workflow_commands(&bytes);
    }

    #[test]
    fn command_shaped_json_never_panics(bytes in command_like()) {
        fuzzing::workflow_commands(&bytes);
    }

    #[test]
    fn payloads_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        fuzzing::payload(&bytes);
    }

    #[test]
    fn avro_frames_with_the_right_header_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut frame = vec![0xc3, 0x01, 0xe2, 0xa3, 0x3d, 0xff, 0x55, 0x80, 0x22, 0x37];
        frame.extend(body);
        use base64::Engine;
        fuzzing::payload(base64::engine::general_purpose::STANDARD.encode(&frame).as_bytes());
    }

    #[test]
    fn visibility_queries_never_panic(text in query_like()) {
        fuzzing::visibility_query(text.as_bytes());
    }

    #[test]
    fn random_queries_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzzing::visibility_query(&bytes);
    }

    #[test]
    fn schedule_specs_never_panic(text in cron_like()) {
        fuzzing::schedule_spec(text.as_bytes());
    }

    #[test]
    fn random_schedule_specs_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        fuzzing::schedule_spec(&bytes);
    }
}
