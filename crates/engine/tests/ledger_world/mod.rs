//! A run and the store's view of its ledger, driven transition by transition: the harness the
//! ledger tests share.
#![allow(dead_code)]

use capstan_engine::*;
use serde_json::{json, Map};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const LEASE_MS: i64 = 30_000;

/// A stand-in codec: payload blobs are plain JSON text.
pub struct JsonCodec;

impl MemoCodec for JsonCodec {
    fn merge(&self, _: MemoBase<'_>, _: &Payload) -> Result<MergedMemo, String> {
        Err("not used here".into())
    }

    fn to_json(&self, payload: &Payload) -> Result<serde_json::Value, String> {
        serde_json::from_str(&payload.blob).map_err(|e| e.to_string())
    }

    fn json_to_payload(&self, value: &serde_json::Value) -> Result<Payload, String> {
        Ok(Payload::avro(value.to_string()))
    }
}

pub fn definition(mode: RecoveryMode, marker: i64) -> ActionDefinition {
    let document: Map<String, serde_json::Value> = json!({"recovery_mode": mode.as_str(), "marker": marker})
        .as_object()
        .unwrap()
        .clone();
    ActionDefinition {
        namespace: "default".into(),
        activity_type: "pay".into(),
        version: marker as u32,
        recovery_mode: mode,
        definition_hash: ActionDefinition::hash_of("pay", &document),
        document,
        updated_at: 0,
    }
}

pub struct World {
    pub run: RunState,
    pub ids: SequentialIds,
    pub limits: Limits,
    pub now: Millis,
    pub history: Vec<HistoryEvent>,
    pub checkpoints: Vec<LedgerCheckpoint>,
    /// Every entry as last written (the store's view; the run keeps only open ones).
    pub ledger: BTreeMap<String, LedgerEntry>,
    /// Reconciliation probes' host runs, as started.
    pub probes: Vec<RunState>,
}

impl World {
    pub fn start() -> Self {
        let limits = Limits::default();
        let mut ids = SequentialIds::new("id");
        let mut cx = Cx::new(1_000, &mut ids, &limits);
        let run = start_run(
            &mut cx,
            // Without run deadlines: these tests fire every due deadline they see.
            StartRun {
                scheduling: Default::default(),
                execution_timeout_seconds: None,
                run_timeout_seconds: None,
                ..crate::support::start_fixture()
            },
        );
        let history = cx.effects.events;
        Self {
            run,
            ids,
            limits,
            now: 1_000,
            history,
            checkpoints: vec![],
            ledger: BTreeMap::new(),
            probes: vec![],
        }
    }

    pub fn apply<T>(&mut self, f: impl FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal>) -> Result<T, Refusal> {
        let before = self.run.clone();
        let mut cx = Cx::new(self.now, &mut self.ids, &self.limits);
        match f(&mut self.run, &mut cx) {
            Ok(value) => {
                self.history.extend(cx.effects.events);
                self.checkpoints.extend(cx.effects.checkpoints);
                for entry in cx.effects.ledger {
                    self.ledger.insert(entry.ledger_key.clone(), entry);
                }
                self.probes.extend(cx.effects.probes_started.into_iter().map(|(probe, _)| probe));
                Ok(value)
            }
            Err(refusal) => {
                self.run = before;
                Err(refusal)
            }
        }
    }

    pub fn ready(&self, kind: TaskKind) -> Option<TaskId> {
        self.run
            .tasks
            .values()
            .find(|t| t.kind == kind && t.is_ready() && t.available_at <= self.now)
            .map(|t| t.id.clone())
    }

    /// The workflow's first task schedules one `pay` activity while `declared` is in force.
    pub fn schedule_pay(&mut self, declared: Option<&ActionDefinition>) {
        self.schedule_pay_with(declared, "amount-100");
    }

    pub fn schedule_pay_with(&mut self, declared: Option<&ActionDefinition>, arguments: &str) {
        let task = self.ready(TaskKind::Workflow).unwrap();
        let lease = self.apply(|run, cx| lease_workflow_task(run, cx, &task, "w", LEASE_MS)).unwrap();
        let actions: BTreeMap<String, ActionDefinition> = declared.map(|d| (d.activity_type.clone(), d.clone())).into_iter().collect();
        let command = WorkflowCommand::ScheduleActivity(ScheduleActivity {
            activity_type: "pay".into(),
            arguments: Payload::avro(arguments),
            queue: None,
            retry_policy: None,
            timeouts: ActivityTimeouts::default(),
            tags: Map::new(),
            cancellation_policy: None,
            worker_session: None,
        });
        self.apply(|run, cx| {
            cx.actions = Some(Arc::new(actions));
            cx.memo = Some(&JsonCodec);
            complete_workflow_task(run, cx, &task, "w", lease.fence, vec![command])
        })
        .unwrap();
    }

    pub fn dispatch(&mut self, current: Option<&ActionDefinition>) -> Option<(TaskId, ActivityAttemptId)> {
        let id = self.ready(TaskKind::Activity)?;
        let leased = self
            .apply(|run, cx| lease_activity_task_with(run, cx, &id, "a", LEASE_MS, current))
            .unwrap()?;
        let TaskDetail::Activity {
            attempt_id: Some(attempt), ..
        } = leased.detail
        else {
            panic!("no attempt")
        };
        Some((id, attempt))
    }

    pub fn count(&self, event_type: EventType) -> usize {
        self.history.iter().filter(|e| e.event_type == event_type).count()
    }

    pub fn entries(&self, state: LedgerState) -> Vec<&LedgerEntry> {
        self.ledger.values().filter(|e| e.state == state).collect()
    }
}

pub fn failure(message: &str) -> ActivityFailure {
    ActivityFailure {
        message: message.into(),
        failure_type: Some("ProviderError".into()),
        class: None,
        code: None,
        stack_trace: None,
        non_retryable: false,
        details: None,
    }
}

pub fn defined(mode: RecoveryMode, extra: serde_json::Value) -> ActionDefinition {
    let mut document: Map<String, serde_json::Value> = json!({"recovery_mode": mode.as_str()}).as_object().unwrap().clone();
    document.extend(extra.as_object().unwrap().clone());
    ActionDefinition {
        namespace: "default".into(),
        activity_type: "pay".into(),
        version: 1,
        recovery_mode: mode,
        definition_hash: ActionDefinition::hash_of("pay", &document),
        document,
        updated_at: 0,
    }
}

/// Dispatches the ready `pay` attempt and reports `result` (JSON text) for it.
pub fn report(world: &mut World, definition: &ActionDefinition, result: &str) {
    let (task, attempt) = world.dispatch(Some(definition)).expect("a dispatch");
    world
        .apply(|run, cx| {
            cx.memo = Some(&JsonCodec);
            complete_activity(run, cx, &task, &attempt, "a", Payload::avro(result))
        })
        .unwrap();
}
