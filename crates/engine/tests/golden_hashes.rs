//! Golden vectors of the history hash chain: known events and known runs hash to known values.
//!
//! The chain is a durable, externally verified format. These values were computed once and must
//! never change: a refactor, a new dependency feature (serde_json's `preserve_order`, say) or a
//! different JSON writer that alters one byte of the canonical form fails here first.

use capstan_engine::*;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

const LEASE_MS: i64 = 30_000;
const T0: Millis = 1_700_000_000_000;

fn object(value: Value) -> Map<String, Value> {
    value.as_object().expect("an object").clone()
}

/// An object whose keys are inserted in reverse of their sorted order.
fn unsorted(pairs: &[(&str, Value)]) -> Map<String, Value> {
    let mut map = Map::new();
    for (key, value) in pairs.iter().rev() {
        map.insert(key.to_string(), value.clone());
    }
    map
}

fn event(
    sequence: u64,
    event_type: EventType,
    payload: Map<String, Value>,
    prev_hash: &str,
    task: Option<&str>,
    command: Option<&str>,
) -> HistoryEvent {
    let mut event = HistoryEvent {
        id: EventId(format!("ev-{sequence}")),
        sequence,
        event_type,
        payload,
        workflow_task_id: task.map(TaskId::from),
        workflow_command_id: command.map(CommandId::from),
        recorded_at: T0 + sequence as i64,
        prev_hash: prev_hash.to_string(),
        hash: String::new(),
    };
    event.hash = event.computed_hash();
    event
}

/// Three hand-built events of one chain, covering every JSON shape a payload can carry. Their
/// hashes were also checked outside Rust: `sha256(prev_hash ‖ canonical)` in Python over the
/// same canonical text, which Python's own sorted compact `json.dumps` reproduces.
fn known_events() -> Vec<HistoryEvent> {
    let started = event(
        1,
        EventType::WorkflowStarted,
        unsorted(&[
            ("zeta", json!("last")),
            ("alpha", json!({"z": 1, "a": {"y": [3, 2, 1], "b": null}, "m": {}})),
            ("Upper", json!("capitals sort before lowercase")),
            ("_under", json!("underscore sorts between")),
            ("10", json!("digits sort first")),
            ("9", json!("byte order, not numeric")),
            ("ü-key", json!("non-ASCII keys sort by UTF-8 bytes")),
        ]),
        GENESIS_HASH,
        None,
        Some("cmd-start"),
    );

    let scheduled = event(
        2,
        EventType::ActivityScheduled,
        object(json!({
            "unicode": "naïve ☃ 𝄞 日本",
            "escapes": "quote \" backslash \\ slash / newline \n tab \t cr \r nul \u{0} bell \u{7} del \u{7f} ls \u{2028}",
            "html": "</script><b>&amp;</b>",
            "integers": [0, 1, -1, -17, 42, i64::MAX, i64::MIN, u64::MAX],
            "floats": [0.5, -0.125, 2.5e-8, 1.0e300, 0.1, -1234.5678, 100.0],
            "booleans": [true, false],
            "nothing": null,
            "empty_array": [],
            "empty_object": {},
            "nested": [{"b": 2, "a": 1}, [[], [{}]], "s", null],
        })),
        &started.hash,
        Some("task-1"),
        None,
    );

    let fired = event(3, EventType::TimerFired, Map::new(), &scheduled.hash, None, None);
    vec![started, scheduled, fired]
}

const KNOWN_CANONICAL: [&str; 3] = [
    "{\"event_type\":\"WorkflowStarted\",\"payload\":{\"10\":\"digits sort first\",\"9\":\"byte order, not numeric\",\"Upper\":\"capitals sort before lowercase\",\"_under\":\"underscore sorts between\",\"alpha\":{\"a\":{\"b\":null,\"y\":[3,2,1]},\"m\":{},\"z\":1},\"zeta\":\"last\",\"ü-key\":\"non-ASCII keys sort by UTF-8 bytes\"},\"recorded_at\":1700000000001,\"sequence\":1,\"workflow_command_id\":\"cmd-start\",\"workflow_task_id\":null}",
    "{\"event_type\":\"ActivityScheduled\",\"payload\":{\"booleans\":[true,false],\"empty_array\":[],\"empty_object\":{},\"escapes\":\"quote \\\" backslash \\\\ slash / newline \\n tab \\t cr \\r nul \\u0000 bell \\u0007 del \u{7f} ls \u{2028}\",\"floats\":[0.5,-0.125,2.5e-8,1e+300,0.1,-1234.5678,100.0],\"html\":\"</script><b>&amp;</b>\",\"integers\":[0,1,-1,-17,42,9223372036854775807,-9223372036854775808,18446744073709551615],\"nested\":[{\"a\":1,\"b\":2},[[],[{}]],\"s\",null],\"nothing\":null,\"unicode\":\"naïve ☃ 𝄞 日本\"},\"recorded_at\":1700000000002,\"sequence\":2,\"workflow_command_id\":null,\"workflow_task_id\":\"task-1\"}",
    "{\"event_type\":\"TimerFired\",\"payload\":{},\"recorded_at\":1700000000003,\"sequence\":3,\"workflow_command_id\":null,\"workflow_task_id\":null}",
];

const KNOWN_HASHES: [&str; 3] = [
    "acc1df1a3bbc5780183a65ef8b569e4c7862896726fb861f8c54efa507e0b39d",
    "3846122e4ab8155246b54f24d1288297c2e0faa84c6914a8ceb744a46b94eec8",
    "b65d50439619769c4dca24984f252fe790bfa65aed7fd948438e27456518a1bf",
];

#[test]
fn known_events_have_their_known_canonical_form_and_hash() {
    let events = known_events();
    let canonical: Vec<String> = events.iter().map(HistoryEvent::canonical_json).collect();
    let hashes: Vec<&str> = events.iter().map(|e| e.hash.as_str()).collect();
    assert_eq!(canonical, KNOWN_CANONICAL);
    assert_eq!(hashes, KNOWN_HASHES);
    verify_chain(&events).unwrap();
}

#[test]
fn the_chain_hash_is_sha256_of_the_previous_hash_and_the_canonical_text() {
    assert_eq!(
        chain_hash(GENESIS_HASH, "{}"),
        "5508d2b710e64bc470079e1b211d9c58e21011e59d0559e422345dc19d659a75"
    );
    assert_eq!(
        chain_hash("", ""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

// ---------------------------------------------------------------------------------------------
// Whole runs

/// One run and the history it produced so far.
struct Chain {
    run: RunState,
    history: Vec<HistoryEvent>,
}

impl Chain {
    fn head(&self) -> (&str, usize) {
        assert_eq!(self.run.last_hash, self.history.last().map(|e| e.hash.clone()).unwrap_or_default());
        verify_chain_from(&self.run.chain_origin, &self.history).expect("an unbroken chain");
        (self.run.last_hash.as_str(), self.history.len())
    }
}

/// The deterministic surroundings every transition of a scenario shares.
struct World {
    ids: SequentialIds,
    limits: Limits,
    now: Millis,
    actions: Option<Arc<BTreeMap<String, ActionDefinition>>>,
    checkpoints: Vec<LedgerCheckpoint>,
}

impl World {
    fn new() -> Self {
        Self {
            ids: SequentialIds::new("id"),
            limits: Limits::default(),
            now: T0,
            actions: None,
            checkpoints: Vec::new(),
        }
    }

    fn start(&mut self, start: StartRun) -> Chain {
        let mut cx = Cx::new(self.now, &mut self.ids, &self.limits);
        let run = start_run(&mut cx, start);
        Chain {
            run,
            history: cx.effects.events,
        }
    }

    /// Applies one transition that must succeed; returns its value and what else it produced.
    fn apply<T>(&mut self, chain: &mut Chain, f: impl FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal>) -> (T, Effects) {
        let mut cx = Cx::new(self.now, &mut self.ids, &self.limits);
        cx.actions = self.actions.clone();
        let value = f(&mut chain.run, &mut cx).expect("the transition is accepted");
        let mut effects = cx.effects;
        chain.history.append(&mut effects.events);
        self.checkpoints.append(&mut effects.checkpoints);
        (value, effects)
    }

    fn ready(&self, chain: &Chain, kind: TaskKind) -> TaskId {
        chain
            .run
            .tasks
            .values()
            .find(|t| t.kind == kind && t.is_ready() && t.available_at <= self.now)
            .map(|t| t.id.clone())
            .expect("a ready task")
    }

    fn lease_workflow(&mut self, chain: &mut Chain) -> (TaskId, u64) {
        let id = self.ready(chain, TaskKind::Workflow);
        let (task, _) = self.apply(chain, |run, cx| lease_workflow_task(run, cx, &id, "worker-1", LEASE_MS));
        (id, task.fence)
    }

    fn complete_workflow(&mut self, chain: &mut Chain, commands: Vec<WorkflowCommand>) -> Effects {
        let (id, fence) = self.lease_workflow(chain);
        self.apply(chain, |run, cx| complete_workflow_task(run, cx, &id, "worker-1", fence, commands))
            .1
    }

    fn lease_activity(&mut self, chain: &mut Chain) -> (TaskId, ActivityAttemptId) {
        let id = self.ready(chain, TaskKind::Activity);
        let (task, _) = self.apply(chain, |run, cx| lease_activity_task(run, cx, &id, "worker-1", LEASE_MS));
        let TaskDetail::Activity {
            attempt_id: Some(attempt), ..
        } = task.detail
        else {
            panic!("an activity lease carries its attempt id")
        };
        (id, attempt)
    }

    /// Moves the clock and runs every deadline that passed, as the server's clock does.
    fn advance(&mut self, chain: &mut Chain, ms: i64) {
        self.now += ms;
        let now = self.now;
        let due: Vec<TaskId> = chain
            .run
            .tasks
            .values()
            .filter(|t| t.deadline_at.is_some_and(|d| d <= now))
            .map(|t| t.id.clone())
            .collect();
        for id in due {
            self.apply(chain, |run, cx| Ok(on_deadline(run, cx, &id)));
        }
    }
}

fn start(workflow_id: &str) -> StartRun {
    StartRun {
        scheduling: Default::default(),
        namespace: "default".into(),
        workflow_id: workflow_id.into(),
        run_id: format!("{workflow_id}-run-1").as_str().into(),
        workflow_type: "order".into(),
        task_queue: "orders".into(),
        input: Payload::avro("wwHioz3/VYAiNwwA"),
        execution_timeout_seconds: Some(86_400),
        run_timeout_seconds: Some(3_600),
        business_key: None,
        memo: Map::new(),
        search_attributes: Map::new(),
        command_id: "cmd-start".into(),
        contract: None,
        compatibility: None,
        origin_trace: None,
        principal: None,
    }
}

fn tags(value: Value) -> StepTags {
    object(value)
}

#[test]
fn an_activity_timer_and_repair_run_ends_at_its_known_head() {
    let mut world = World::new();
    let mut chain = world.start(StartRun {
        business_key: Some("order-ü-42".into()),
        memo: unsorted(&[("zeta", json!(1)), ("alpha", json!({"b": [1, 2.5, -3], "a": null}))]),
        search_attributes: unsorted(&[("Priority", json!(-3)), ("Score", json!(2.5)), ("Customer", json!("Zoë"))]),
        contract: Some(CommandContract {
            signals: vec!["approve".into()],
            updates: vec!["set_price".into()],
            ..Default::default()
        }),
        ..start("wf-activity")
    });
    world.complete_workflow(
        &mut chain,
        vec![
            WorkflowCommand::ScheduleActivity(ScheduleActivity {
                activity_type: "charge".into(),
                arguments: Payload::avro("Y2hhcmdl"),
                queue: Some("payments".into()),
                retry_policy: Some(RetryPolicy {
                    max_attempts: Some(3),
                    backoff_seconds: vec![1, 2],
                    non_retryable_error_types: vec!["Fatal".into()],
                }),
                timeouts: ActivityTimeouts {
                    start_to_close_seconds: Some(30),
                    heartbeat_seconds: Some(10),
                    ..Default::default()
                },
                cancellation_policy: None,
                worker_session: None,
                tags: tags(json!({"zz_note": "quoted \"x\"\n", "aa_note": "first"})),
            }),
            WorkflowCommand::StartTimer {
                delay_seconds: 5,
                tags: Map::new(),
            },
            WorkflowCommand::RecordSideEffect {
                result: Payload::avro("c2lkZQ=="),
                tags: Map::new(),
                stream: None,
            },
            WorkflowCommand::RecordVersionMarker {
                change_id: "v2-pricing".into(),
                version: 1,
                min_supported: -1,
                max_supported: 2,
                tags: Map::new(),
            },
            WorkflowCommand::UpsertSearchAttributes {
                attributes: unsorted(&[("Score", json!(3.75)), ("Tags", json!(["a", "b"])), ("Priority", Value::Null)]),
                tags: Map::new(),
                attribute_types: None,
            },
        ],
    );

    let (task, attempt) = world.lease_activity(&mut chain);
    world.apply(&mut chain, |run, cx| {
        fail_activity(
            run,
            cx,
            &task,
            &attempt,
            "worker-1",
            ActivityFailure {
                message: "card declined: “insufficient funds”".into(),
                failure_type: Some("Declined".into()),
                class: None,
                code: Some(json!(-402)),
                stack_trace: Some("at charge()\n\tat main()".into()),
                non_retryable: false,
                details: Some(Payload::avro("ZGV0YWlscw==")),
            },
        )
    });
    world.advance(&mut chain, 1_000);
    let (task, attempt) = world.lease_activity(&mut chain);
    world.apply(&mut chain, |run, cx| {
        heartbeat_activity(
            run,
            cx,
            &task,
            &attempt,
            "worker-1",
            LEASE_MS,
            Some(json!({"progress": 0.5, "note": "½ done"})),
        )
    });
    world.apply(&mut chain, |run, cx| {
        complete_activity(run, cx, &task, &attempt, "worker-1", Payload::avro("b2s="))
    });
    world.advance(&mut chain, 5_000);

    // A workflow task fails and is held back; an operator's repair offers it at once.
    let (task, fence) = world.lease_workflow(&mut chain);
    world.apply(&mut chain, |run, cx| {
        let failure = WorkflowTaskFailure {
            message: "replay diverged".into(),
            failure_type: Some("NonDeterminism".into()),
            reason: Some("history_shape_mismatch".into()),
            sequence: Some(2),
            stack_trace: Some("at replay()".into()),
        };
        fail_workflow_task(run, cx, &task, "worker-1", fence, failure)
    });
    world.apply(&mut chain, |run, cx| repair(run, cx, "cmd-repair".into()));
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::CompleteWorkflow {
            result: Payload::avro("ZG9uZQ=="),
        }],
    );
    world.apply(&mut chain, |run, cx| {
        archive(run, cx, Some("retention".into()), "cmd-archive".into())
    });

    assert_eq!(
        chain.head(),
        ("1cf43067eb7de3bc4dc9a1a351edc3ab087832659e8c4e445ab98f4e3321b120", 17)
    );
}

fn local_activity() -> WorkflowCommand {
    WorkflowCommand::RecordLocalActivity(LocalActivityRecord {
        activity_type: "lookup".into(),
        arguments: Payload::avro("bG9va3Vw"),
        echoed: object(json!({"retry_policy": {"max_attempts": 2}, "start_to_close_timeout": 5})),
        outcome: LocalOutcome::Completed(Payload::avro("Zm91bmQ=")),
        attempts: vec![
            LocalAttempt {
                attempt_number: 1,
                worker_attempt_id: Some("local-a1".into()),
                heartbeats: vec![json!({"elapsed_ms": 12, "details": {"step": "dns"}})],
                retry: object(json!({"retry_reason": "failure", "backoff_seconds": 1, "message": "timeout\tdns"})),
                duration_ms: None,
            },
            LocalAttempt {
                attempt_number: 2,
                worker_attempt_id: None,
                heartbeats: vec![],
                retry: Map::new(),
                duration_ms: None,
            },
        ],
        tags: Map::new(),
    })
}

#[test]
fn a_run_with_signals_updates_a_retried_child_and_a_terminate_ends_at_its_known_head() {
    let mut world = World::new();
    let mut chain = world.start(start("wf-parent"));
    let effects = world.complete_workflow(
        &mut chain,
        vec![
            WorkflowCommand::OpenSignalWait {
                signal_name: "approve".into(),
                timeout_seconds: Some(60),
                tags: Map::new(),
            },
            WorkflowCommand::StartChildWorkflow(StartChild {
                workflow_type: "shipment".into(),
                arguments: Payload::avro("c2hpcA=="),
                queue: None,
                workflow_id: None,
                parent_close_policy: "terminate".into(),
                cancellation_policy: "abandon".into(),
                execution_timeout_seconds: Some(600),
                run_timeout_seconds: None,
                retry_policy: Some(RetryPolicy {
                    max_attempts: Some(2),
                    backoff_seconds: vec![5],
                    non_retryable_error_types: vec![],
                }),
                tags: Map::new(),
                observability_context: None,
            }),
            local_activity(),
        ],
    );
    let (child_run, child_events) = effects.children_started.into_iter().next().expect("a child run");
    let mut child = Chain {
        run: child_run,
        history: child_events.events,
    };

    // The child fails; its parent's retry policy starts the child's next run.
    let effects = world.complete_workflow(
        &mut child,
        vec![WorkflowCommand::FailWorkflow(WorkflowFailure {
            message: "warehouse closed".into(),
            exception_type: Some("Closed".into()),
            exception_class: None,
            exception: Some(json!({"where": "dock 7", "codes": [1, -2]})),
            non_retryable: false,
            boundary: None,
        })],
    );
    let notice = effects.parent_notice.expect("the parent hears of the child");
    let (retried, retried_effects) = *effects.successor.expect("a retried child run");
    let retried = Chain {
        run: retried,
        history: retried_effects.events,
    };
    world.apply(&mut chain, |run, cx| resolve_child(run, cx, &notice));

    world.apply(&mut chain, |run, cx| {
        signal(run, cx, "approve", Payload::avro("eWVz"), "cmd-signal".into())
    });
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::OpenConditionWait {
            condition_key: Some("price_set".into()),
            fingerprint: Some("fp-1".into()),
            timeout_seconds: Some(120),
            tags: Map::new(),
            occurrence_id: None,
        }],
    );
    let ((update_id, _), _) = world.apply(&mut chain, |run, cx| {
        accept_update(run, cx, "set_price", Payload::avro("MTA="), "cmd-update".into())
    });
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::CompleteUpdate {
            update_id,
            result: Payload::avro("b2s="),
        }],
    );
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::StartTimer {
            delay_seconds: 10,
            tags: Map::new(),
        }],
    );
    world.apply(&mut chain, |run, cx| {
        let rejection = UpdateRejection {
            message: "price must be positive".into(),
            failure_type: Some("ValidationError".into()),
            validation_errors: Some(json!({"price": ["must be > 0"]})),
        };
        reject_update(run, cx, "set_price", Payload::avro("LTE="), rejection, "cmd-reject".into())
    });
    let (_, effects) = world.apply(&mut chain, |run, cx| {
        close_by_command(
            run,
            cx,
            CloseCommand::Terminate,
            Some("operator: stop ✋".into()),
            "cmd-terminate".into(),
        )
    });
    assert_eq!(effects.close_children.len(), 1);

    assert_eq!(retried.run.chain_origin, child.run.last_hash);
    // Every new run, however it began, is written at the current document version.
    for run in [&chain.run, &child.run, &retried.run] {
        assert_eq!(run.document_version, RUN_DOCUMENT_VERSION);
    }
    assert_eq!(
        (chain.head(), child.head(), retried.head()),
        (
            ("304ec95d424ab0736fd094a548734b258f2be44abc44f3d226a0aeecb2a8419f", 26),
            ("321163664739c8dc96060094cbf4136851aea55ac6990ec01339c2c8511cf7dd", 2),
            ("dc308d2e127f7d9f1abac9a0b44a5b5e8328fca4b89d67716b12fc3706e2b301", 1),
        )
    );
}

#[test]
fn a_continued_run_cancelled_cooperatively_ends_at_its_known_head() {
    let mut world = World::new();
    let mut chain = world.start(start("wf-continue"));
    let effects = world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::ContinueAsNew {
            arguments: Payload::avro("bmV4dA=="),
            workflow_type: None,
            queue: Some("orders-v2".into()),
            tags: tags(json!({"reason": "history too long"})),
            observability_context: None,
        }],
    );
    let (next, next_effects) = *effects.successor.expect("a successor run");
    let mut next = Chain {
        run: next,
        history: next_effects.events,
    };
    world.complete_workflow(
        &mut next,
        vec![WorkflowCommand::StartTimer {
            delay_seconds: 30,
            tags: Map::new(),
        }],
    );
    world.apply(&mut next, |run, cx| {
        request_cancellation(run, cx, Some("customer asked".into()), 60, "cmd-cancel".into())
    });
    let (task, fence) = world.lease_workflow(&mut next);
    world.apply(&mut next, |run, cx| {
        let delivery = DeliveryRequest {
            request_id: "cmd-cancel".into(),
            sequence: 1,
            call_kind: "timer".into(),
            sequence_span: 1,
            operation_sequence: None,
            operation_sequence_span: 1,
        };
        deliver_cancellation(run, cx, &task, "worker-1", fence, delivery)
    });
    world.apply(&mut next, |run, cx| {
        let commands = vec![WorkflowCommand::CompleteWorkflow {
            result: Payload::avro(capstan_engine::payload::AVRO_NULL_BLOB),
        }];
        complete_workflow_task(run, cx, &task, "worker-1", fence, commands)
    });

    assert_eq!(next.run.chain_origin, chain.run.last_hash);
    assert_eq!(next.run.document_version, RUN_DOCUMENT_VERSION);
    assert_eq!(
        (chain.head(), next.head()),
        (
            ("310e251e0de746aa08021a4c897e9f5769233165150162f1873a749d41f3569d", 3),
            // Re-pinned when `CooperativeCancellationRequested` gained its `cancellation`
            // context (the SDKs compare a prepared local activity's stop with it).
            ("60154752f718b6d866e8f458b0d6e5fec8d114e7598b2e2ee7207aa8a9963710", 6),
        )
    );
}

#[test]
fn a_run_timeout_ends_at_its_known_head() {
    let mut world = World::new();
    let mut chain = world.start(StartRun {
        run_timeout_seconds: Some(2),
        ..start("wf-timeout")
    });
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::OpenSignalWait {
            signal_name: "never".into(),
            timeout_seconds: None,
            tags: Map::new(),
        }],
    );
    world.advance(&mut chain, 2_000);
    assert_eq!(chain.run.closed_reason, Some(ClosedReason::TimedOut));
    assert_eq!(
        chain.head(),
        ("67105a5fa3222717f7c9c11b4dd924b0d32776e71505ea50e8db44f16766a064", 4)
    );
}

#[test]
fn a_declared_action_with_an_unknown_outcome_ends_at_its_known_heads() {
    let document = object(json!({"recovery_mode": "non_atomic", "owner": "payments"}));
    let definition = ActionDefinition {
        namespace: "default".into(),
        activity_type: "pay".into(),
        version: 3,
        recovery_mode: RecoveryMode::NonAtomic,
        definition_hash: ActionDefinition::hash_of("pay", &document),
        document,
        updated_at: 0,
    };
    let mut world = World::new();
    world.actions = Some(Arc::new(BTreeMap::from([("pay".to_string(), definition.clone())])));
    let mut chain = world.start(start("wf-ledger"));
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::ScheduleActivity(ScheduleActivity {
            activity_type: "pay".into(),
            arguments: Payload::avro("cGF5"),
            queue: None,
            retry_policy: None,
            timeouts: ActivityTimeouts {
                start_to_close_seconds: Some(10),
                ..Default::default()
            },
            cancellation_policy: None,
            worker_session: None,
            tags: Map::new(),
        })],
    );
    let task = world.ready(&chain, TaskKind::Activity);
    world.apply(&mut chain, |run, cx| {
        lease_activity_task_with(run, cx, &task, "worker-1", LEASE_MS, Some(&definition))
    });
    // The attempt times out: a dispatched declared action's outcome is unknown.
    world.advance(&mut chain, 10_000);
    let key = chain.run.ledger.keys().next().cloned().expect("an open entry");
    world.apply(&mut chain, |run, cx| {
        let decision = LedgerDecision::EffectConfirmed {
            result: Payload::avro("cGFpZA=="),
        };
        resolve_ledger_entry(
            run,
            cx,
            &key,
            decision,
            json!({"ticket": "OPS-1", "seen": true}),
            "alice@example.com",
        )
    });

    ledger::verify_checkpoints(&world.checkpoints).expect("an unbroken ledger chain");
    let ledger_head = world.checkpoints.last().map(|c| c.hash.as_str());
    assert_eq!(
        ((ledger_head, world.checkpoints.len()), chain.head()),
        (
            (Some("212bbf12ae9c3786e5290445e79567a2a30261f98993cdbf0db012bf518c235b"), 3),
            ("685c8e40bb2affd4cfa3d5b27a2f28705004a2cec6281f2a66d7dd5ec678d867", 5),
        )
    );
}

/// Computed by the code before the timer and update payloads got their builders (the timeout
/// paths and `fail_update` are not in the scenarios above); the condition timeout's own event
/// added since.
#[test]
fn wait_timeouts_and_a_failed_update_end_at_their_known_head() {
    let mut world = World::new();
    let mut chain = world.start(start("wf-waits"));
    // Tags named like the events' own fields: the events' fields win.
    let clashing = tags(json!({"fired_at": "tag", "condition_key": "tag", "signal_name": "tag", "timer_kind": "tag", "note": "kept"}));
    world.complete_workflow(
        &mut chain,
        vec![
            WorkflowCommand::OpenSignalWait {
                signal_name: "now".into(),
                timeout_seconds: Some(0),
                tags: clashing.clone(),
            },
            WorkflowCommand::OpenSignalWait {
                signal_name: "later".into(),
                timeout_seconds: Some(5),
                tags: clashing.clone(),
            },
            WorkflowCommand::OpenConditionWait {
                condition_key: Some("ready".into()),
                fingerprint: None,
                timeout_seconds: Some(7),
                tags: clashing,
                occurrence_id: None,
            },
        ],
    );
    world.advance(&mut chain, 7_000);
    let ((update_id, _), _) = world.apply(&mut chain, |run, cx| {
        accept_update(run, cx, "bump", Payload::avro("MQ=="), "cmd-bump".into())
    });
    world.complete_workflow(
        &mut chain,
        vec![WorkflowCommand::FailUpdate {
            update_id,
            failure: WorkflowFailure {
                message: "cannot bump".into(),
                exception_type: Some("Refused".into()),
                exception_class: None,
                exception: Some(json!({"depth": 1})),
                non_retryable: true,
                boundary: None,
            },
        }],
    );
    // Updated deliberately (issue 43): the condition wait's timeout now records DW's
    // `ConditionWaitTimedOut` after its timer's `TimerFired` (12 events before, 13 now).
    assert_eq!(
        chain.head(),
        ("dc5a54ca648fa404396e3e05a56f0ad6b42efa73fa7a287f72da3b9959a4abd4", 13)
    );
}
