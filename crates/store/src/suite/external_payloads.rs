//! External payloads: a reference named by an instance's stored state (history, run document,
//! stream items) is in use; one nothing names, past its grace, may be forgotten; removing an
//! instance releases what it named. Namespace storage policies round-trip.

use super::*;
use capstan_engine::payload::RUNTIME_REFERENCE_SCHEMA;
use capstan_engine::workflow_stream::StreamItemInput;

fn reference_id(n: u8) -> String {
    format!("ep_01ARZ3NDEKTSV4RRFFQ69G5FA{}", (b'0' + n) as char)
}

fn record(n: u8) -> ExternalPayloadRecord {
    ExternalPayloadRecord {
        reference_id: reference_id(n),
        namespace: "default".into(),
        codec: "avro".into(),
        size_bytes: 10,
        sha256: "a".repeat(64),
        location: format!("file:///payloads/{}", reference_id(n)),
        created_at: NOW,
    }
}

fn external(n: u8) -> Payload {
    let reference = json!({"schema": RUNTIME_REFERENCE_SCHEMA, "reference_id": reference_id(n), "codec": "avro",
        "size_bytes": 10, "sha256": "a".repeat(64)});
    Payload::external("avro", capstan_engine::PayloadReference::Runtime(reference))
}

async fn unused_ids<S: Store>(store: &S) -> Vec<String> {
    let unused = store.unused_external_payloads(NOW + 1, 100).await.unwrap();
    unused.into_iter().map(|r| r.reference_id).collect()
}

pub async fn external_payloads_are_kept_while_an_instance_names_them<S: Store>(store: S) {
    for n in 0..5 {
        store.record_external_payload(record(n)).await.unwrap();
    }
    assert_eq!(store.external_payload("default", &reference_id(0)).await.unwrap(), Some(record(0)));
    assert_eq!(
        store.external_payload("other", &reference_id(0)).await.unwrap(),
        None,
        "per namespace"
    );
    assert!(
        store.unused_external_payloads(NOW, 100).await.unwrap().is_empty(),
        "none before its grace ends"
    );

    // Named by the start event (input), a signal event, and a stream item.
    let mut request = start_request("holder", "q");
    request.input = external(0);
    let (_, run) = store.start_workflow(request, DuplicatePolicy::Fail, NOW).await.unwrap();
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("holder".into())), NOW, |run, cx| {
            capstan_engine::signal(run, cx, "s", external(1), CommandId("sig-1".into()))
        })
        .await
        .unwrap();
    let target = StreamTarget {
        namespace: "default".into(),
        workflow_id: "holder".into(),
        run_id: run.run_id.as_str().into(),
        stream_name: "out".into(),
    };
    let item = StreamItemInput {
        payload: Some(external(2)),
        payload_reference: None,
        item_type: None,
        content_type: None,
        idempotency_key: None,
    };
    store.append_stream_items(target, vec![item], None, NOW).await.unwrap();
    assert_eq!(unused_ids(&store).await, [reference_id(3), reference_id(4)]);

    // Forgetting is only of what is still unused.
    assert!(!store.forget_unused_external_payload("default", &reference_id(0)).await.unwrap());
    assert!(store.forget_unused_external_payload("default", &reference_id(3)).await.unwrap());
    assert_eq!(store.external_payload("default", &reference_id(3)).await.unwrap(), None);
    assert_eq!(unused_ids(&store).await, [reference_id(4)]);

    // Removing the instance releases everything it named.
    store
        .mutate_run("default", RunLocator::Current(WorkflowId("holder".into())), NOW, |run, cx| {
            close_by_command(run, cx, CloseCommand::Terminate, None, "c".into())
        })
        .await
        .unwrap();
    assert_eq!(store.prune_instances("default", vec!["holder".into()], NOW + 1).await.unwrap(), 1);
    assert_eq!(
        unused_ids(&store).await,
        [reference_id(0), reference_id(1), reference_id(2), reference_id(4)]
    );
}

pub async fn namespace_storage_policies_are_set_and_cleared<S: Store>(store: S) {
    let policy = ExternalStoragePolicy {
        driver: "s3".into(),
        enabled: true,
        threshold_bytes: Some(1024),
        config: json!({"bucket": "b", "prefix": "p"}).as_object().unwrap().clone(),
    };
    let set = store
        .set_namespace_external_storage("default", Some(policy.clone()), NOW + 5)
        .await
        .unwrap();
    assert_eq!(set.external_payload_storage, Some(policy.clone()));
    assert_eq!(set.updated_at, NOW + 5);
    let listed = store.namespaces().await.unwrap();
    assert_eq!(listed[0].external_payload_storage, Some(policy));
    // Another field's update keeps the policy.
    let updated = store.update_namespace("default", Some("d".into()), None, NOW + 6).await.unwrap();
    assert!(updated.external_payload_storage.is_some());
    let cleared = store.set_namespace_external_storage("default", None, NOW + 7).await.unwrap();
    assert_eq!(cleared.external_payload_storage, None);
    assert_eq!(
        reason(store.set_namespace_external_storage("missing", None, NOW).await),
        Reason::NamespaceNotFound
    );
}
