//! The simulated workflow programs: the steps a program is made of, the [`Programs`] of the
//! workflows the clients started, and the fixed choices a program's calls carry (cancellation
//! policy, worker session, local call descriptor). How a worker replays a program against a
//! run's history is `replay`; the catalog operation programs call is `nexus`.

pub(crate) mod nexus;
pub(crate) mod replay;

use crate::workload::{CHILD_TYPE, DECLARED, PAYLOAD, PLAIN};
use capstan_engine::service_call::CallMode;
use capstan_engine::{ActivityCancellationPolicy, LocalDescriptor, Payload, RetryPolicy, SessionOptions, SessionRequirement};
use serde_json::{json, Map};
use std::collections::BTreeMap;

/// One step of a simulated workflow's program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    Activity(&'static str),
    /// A plain activity in the instance's worker session (only its holder may run it).
    SessionActivity,
    Timer(i64),
    /// Waits for the signal `go-N`.
    Signal(usize),
    /// Opens a condition wait nothing satisfies (a signal may) with this timeout, in seconds:
    /// it ends as its timer's `TimerFired` and its own `ConditionWaitTimedOut`.
    Condition(i64),
    /// Starts a child workflow and waits for it to close.
    Child,
    /// Calls the catalog operation bound to the child type: `Sync` waits for the linked run's
    /// end, `Async` resumes at admission.
    Nexus(CallMode),
    /// A prepared local activity: admitted, run and reported on the workflow task's claim.
    LocalActivity,
    /// Ends this run's part of the program: the next run of the instance does the rest.
    ContinueAsNew,
    /// Appends two items to the run's output stream `out` (a `record_side_effect` directive);
    /// it does not wait, so it rides with the next step's command.
    Stream,
    /// First step only: the workflow fails with its first activity that fails for good,
    /// naming the failed step (so a client can redrive it). Such programs are plain activities.
    FailWithActivity,
}

/// The programs of the workflows the clients started, by workflow id (children and scheduled
/// workflows run fixed programs of their type).
#[derive(Default)]
pub(crate) struct Programs(BTreeMap<String, Vec<Step>>);

impl Programs {
    /// How many workflows (and standalone activities) the clients started.
    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn insert(&mut self, workflow_id: String, program: Vec<Step>) {
        self.0.insert(workflow_id, program);
    }

    /// The ids of the workflows the clients started.
    pub(crate) fn ids(&self) -> impl ExactSizeIterator<Item = &String> {
        self.0.keys()
    }

    /// Whether a client started the instance `workflow_id`.
    pub(crate) fn started(&self, workflow_id: &str) -> bool {
        self.0.contains_key(workflow_id)
    }

    /// The program a run executes: the client's for the workflows it started, a fixed one per
    /// type for children and scheduled workflows.
    pub(crate) fn program_for(&self, workflow_id: &str, workflow_type: &str) -> Vec<Step> {
        if let Some(program) = self.0.get(workflow_id) {
            return program.clone();
        }
        match workflow_type {
            CHILD_TYPE if workflow_id.ends_with(['1', '3', '5', '7', '9']) => {
                vec![Step::Timer(2), Step::Activity(DECLARED)]
            }
            CHILD_TYPE => vec![Step::Activity(PLAIN)],
            _ => vec![Step::Activity(PLAIN), Step::Timer(1)],
        }
    }

    /// The instances running strict programs (see [`Step::FailWithActivity`]).
    pub(crate) fn strict(&self) -> Vec<String> {
        let strict = |program: &Vec<Step>| program.first() == Some(&Step::FailWithActivity);
        self.0.iter().filter(|(_, p)| strict(p)).map(|(id, _)| id.clone()).collect()
    }

    /// The signals a workflow's program waits for (`go-N`), by N.
    pub(crate) fn signals(&self, workflow_id: &str) -> Vec<usize> {
        self.0
            .get(workflow_id)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Step::Signal(n) => Some(*n),
                _ => None,
            })
            .collect()
    }
}
/// The cancellation policy of a workflow's activities: each policy has its share of the
/// instances (by the id's last character, so every replay decides the same).
pub(crate) fn cancellation_policy_of(workflow_id: &str) -> Option<ActivityCancellationPolicy> {
    match workflow_id.bytes().last().unwrap_or(0) % 4 {
        0 => Some(ActivityCancellationPolicy::WaitCancellationCompleted),
        1 => Some(ActivityCancellationPolicy::Abandon),
        2 => Some(ActivityCancellationPolicy::TryCancel),
        _ => None,
    }
}

/// The worker session a workflow's session activities run in: one per instance, long-lived
/// (a session past its TTL would strand its activities, and the simulated clock jumps far).
pub(crate) fn session_of(workflow_id: &str) -> SessionRequirement {
    let options = SessionOptions {
        ttl_seconds: 365 * 86_400,
        ..SessionOptions::new(format!("sess-{workflow_id}"))
    };
    let as_sent = json!({"session_id": options.session_id, "ttl_seconds": options.ttl_seconds});
    SessionRequirement {
        options,
        as_sent: as_sent.as_object().cloned().unwrap_or_default(),
    }
}

/// What a workflow's prepared local calls look like: retried twice, a 10 s start-to-close
/// budget, the instance's cancellation policy (`abandon` is not one a local call may have).
pub(crate) fn local_descriptor(workflow_id: &str) -> LocalDescriptor {
    let cancellation_policy = cancellation_policy_of(workflow_id).filter(|p| *p != ActivityCancellationPolicy::Abandon);
    LocalDescriptor {
        activity_type: PLAIN.into(),
        arguments: Payload::avro(PAYLOAD),
        retry_policy: Some(RetryPolicy {
            max_attempts: Some(3),
            backoff_seconds: vec![1],
            non_retryable_error_types: vec![],
        }),
        cancellation_policy,
        start_to_close_seconds: Some(10),
        schedule_to_close_seconds: None,
        heartbeat_seconds: None,
        cleanup: None,
        tags: Map::new(),
        fingerprint: format!("sim-local-{}", cancellation_policy.map_or("none", |p| p.as_str())),
    }
}
