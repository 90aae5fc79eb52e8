//! Suite checks of what operators and the server's duties read and set: readiness, ledger and
//! integrity figures, the verifier's run pages, wake-ups, system counts, bridge deliveries,
//! build-id rollouts, search-attribute definitions, the worker roster and queue snapshots.

use super::{complete_next, started, timer, worker, NOW};
use crate::*;
use capstan_engine::visibility::AttributeType;
use serde_json::json;
use std::time::Duration;

pub async fn a_healthy_store_is_ready<S: Store>(store: S) {
    store.ping().await.expect("a fresh store answers its readiness probe");
    store.ping().await.expect("and again");
}

pub async fn integrity_figures_start_empty_and_unknown_incidents_are_refused<S: Store>(store: S) {
    assert!(store.integrity_incidents("default", None).await.unwrap().is_empty());
    assert!(store.integrity_incidents("default", Some("open".into())).await.unwrap().is_empty());
    let refused = store
        .close_integrity_incident("default", "no-such-incident", "note".into(), NOW)
        .await;
    assert_eq!(super::reason(refused), Reason::IntegrityIncidentNotFound);
    let stats = store.ledger_stats().await.unwrap();
    assert!(stats.entries.is_empty() && stats.open_incidents.is_empty(), "{stats:?}");
    assert!(store.ledger_instances().await.unwrap().is_empty());
}

pub async fn runs_are_paged_in_id_order<S: Store>(store: S) {
    for id in ["page-a", "page-b", "page-c"] {
        started(&store, id, "q").await;
    }
    let first = store.runs_page(None, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    let rest = store.runs_page(Some(first[1].2.clone()), 2).await.unwrap();
    let all: Vec<_> = first
        .iter()
        .chain(&rest)
        .map(|(ns, w, r)| (ns.clone(), w.0.clone(), r.0.clone()))
        .collect();
    assert_eq!(
        all,
        vec![
            ("default".into(), "page-a".into(), "run-page-a".into()),
            ("default".into(), "page-b".into(), "run-page-b".into()),
            ("default".into(), "page-c".into(), "run-page-c".into()),
        ]
    );
    assert!(store.runs_page(Some(RunId("run-page-c".into())), 2).await.unwrap().is_empty());
}

pub async fn a_committed_ready_task_wakes_its_queue<S: Store>(store: S) {
    let mut wakeups = store.wakeups().await.unwrap().expect("this store announces ready tasks");
    // A listener may still be connecting (PostgreSQL's LISTEN): wake-ups are hints, so keep
    // committing ready tasks until one is heard, within 10 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for attempt in 0.. {
        assert!(tokio::time::Instant::now() < deadline, "no wake-up within 10 s");
        started(&store, &format!("wake-me-{attempt}"), "wake-queue").await;
        let heard = tokio::time::timeout(Duration::from_millis(500), async {
            while let Some(key) = wakeups.recv().await {
                if key == ("default".to_string(), TaskKind::Workflow, "wake-queue".to_string()) {
                    return true;
                }
            }
            false
        })
        .await;
        if heard == Ok(true) {
            break;
        }
    }
}

pub async fn system_counts_count_runs_tasks_and_expired_leases<S: Store>(store: S) {
    started(&store, "count-a", "counted").await;
    started(&store, "count-b", "counted").await;
    let counts = store.system_counts("default", NOW).await.unwrap();
    let runs: i64 = counts.runs_by_status.iter().map(|(_, n)| n).sum();
    assert_eq!(runs, 2, "{counts:?}");
    assert!(counts.tasks.contains(&("workflow".into(), "ready".into(), 2)), "{counts:?}");
    assert_eq!(counts.expired_leases, 0);
    store
        .claim_task("default", TaskKind::Workflow, "counted", &[], "w1", 1_000, NOW, None)
        .await
        .unwrap()
        .expect("a task to lease");
    let later = store.system_counts("default", NOW + 5_000).await.unwrap();
    assert_eq!(later.expired_leases, 1, "{later:?}");
    assert_eq!(later.expired_lease_runs.len(), 1, "{later:?}");
    assert!(store.system_counts("elsewhere", NOW).await.unwrap().runs_by_status.is_empty());
}

pub async fn a_bridge_delivery_is_recorded_once<S: Store>(store: S) {
    assert_eq!(store.bridge_delivery("default", "github", "k1").await.unwrap(), None);
    let first = json!({"outcome": "started", "workflow_id": "w-1"});
    assert_eq!(
        store
            .record_bridge_delivery("default", "github", "k1", first.clone(), NOW)
            .await
            .unwrap(),
        None
    );
    let repeat = store
        .record_bridge_delivery(
            "default",
            "github",
            "k1",
            json!({"outcome": "started", "workflow_id": "w-2"}),
            NOW + 1,
        )
        .await
        .unwrap();
    assert_eq!(repeat, Some(first.clone()), "a repeat gets the first outcome and records nothing");
    assert_eq!(store.bridge_delivery("default", "github", "k1").await.unwrap(), Some(first));
    assert_eq!(store.bridge_delivery("default", "other-adapter", "k1").await.unwrap(), None);
}

pub async fn build_id_cohorts_drain_resume_and_promote<S: Store>(store: S) {
    let drained = store
        .set_build_id_drain("default", "q", Some("b1".into()), true, NOW)
        .await
        .unwrap();
    assert_eq!((drained.drain_intent.as_str(), drained.drained_at), ("draining", Some(NOW)));
    let again = store
        .set_build_id_drain("default", "q", Some("b1".into()), true, NOW + 10)
        .await
        .unwrap();
    assert_eq!(again.drained_at, Some(NOW), "draining again keeps the first drained_at");
    let resumed = store
        .set_build_id_drain("default", "q", Some("b1".into()), false, NOW + 20)
        .await
        .unwrap();
    assert_eq!((resumed.drain_intent.as_str(), resumed.drained_at), ("active", None));
    let promoted = store.promote_build_id("default", "q", Some("b2".into()), NOW + 30).await.unwrap();
    assert_eq!(promoted.promoted_at, Some(NOW + 30));
    store.promote_build_id("default", "q", None, NOW + 40).await.unwrap();
    let rollouts = store.build_id_rollouts("default", "q").await.unwrap();
    let promoted: Vec<_> = rollouts
        .iter()
        .filter(|r| r.promoted_at.is_some())
        .map(|r| r.build_id.clone())
        .collect();
    assert_eq!(promoted, vec![None], "one promoted cohort per queue: {rollouts:?}");
    let ids: Vec<_> = rollouts.iter().map(|r| r.build_id.clone()).collect();
    assert_eq!(ids, vec![None, Some("b1".into()), Some("b2".into())]);
    assert!(store.build_id_rollouts("default", "other").await.unwrap().is_empty());
}

pub async fn search_attribute_definitions_are_defined_once_and_deleted<S: Store>(store: S) {
    store
        .define_search_attribute("default", "Region", AttributeType::Keyword, NOW)
        .await
        .unwrap();
    store
        .define_search_attribute("default", "Amount", AttributeType::Double, NOW)
        .await
        .unwrap();
    let again = store.define_search_attribute("default", "Region", AttributeType::Int, NOW).await;
    assert_eq!(super::reason(again), Reason::SearchAttributeAlreadyExists);
    let defined = store.search_attribute_definitions("default").await.unwrap();
    assert_eq!(defined.get("Region"), Some(&AttributeType::Keyword));
    assert_eq!(defined.get("Amount"), Some(&AttributeType::Double));
    assert!(store.delete_search_attribute("default", "Region").await.unwrap());
    assert!(!store.delete_search_attribute("default", "Region").await.unwrap());
    assert_eq!(store.search_attribute_definitions("default").await.unwrap().len(), 1);
}

pub async fn the_roster_and_queue_snapshots_show_workers_and_tasks<S: Store>(store: S) {
    store.register_worker(worker("w-b", "q1")).await.unwrap();
    store.register_worker(worker("w-a", "q2")).await.unwrap();
    let roster: Vec<_> = store.workers("default").await.unwrap().into_iter().map(|w| w.worker_id).collect();
    assert_eq!(roster, vec!["w-a", "w-b"], "by worker id");
    started(&store, "snap-1", "q1").await;
    started(&store, "snap-2", "q3").await;
    assert_eq!(store.task_queue_names("default").await.unwrap(), vec!["q1", "q2", "q3"]);
    let snapshot = store.task_queue_snapshot("default", "q1", 10).await.unwrap();
    assert_eq!(snapshot.counts, vec![("workflow".into(), "ready".into(), 1, Some(NOW))]);
    assert!(snapshot.leases.is_empty() && snapshot.pinned.is_empty());
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "q1", &[], "w-b", 30_000, NOW, None)
        .await
        .unwrap()
        .expect("a task to lease");
    let snapshot = store.task_queue_snapshot("default", "q1", 10).await.unwrap();
    assert_eq!(snapshot.leases.len(), 1);
    let lease = &snapshot.leases[0];
    assert_eq!(
        (lease.task_id.as_str(), lease.lease_owner.as_deref()),
        (task.id.as_str(), Some("w-b"))
    );
    assert_eq!((lease.workflow_id.as_str(), lease.lease_expires_at), ("snap-1", Some(NOW + 30_000)));
    assert_eq!(store.queue_workers("default", "q1").await.unwrap().len(), 1);
}

/// Overwrites a run's stored document with `bytes` behind the store's back (a backend's test
/// does it with its own driver).
pub type Tamper = Box<dyn Fn(String, String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// A run document that cannot be read (bytes that do not parse, or a version from a newer
/// build) is never a retryable storage error: the first change opens one integrity incident
/// naming the run, every later one answers with that incident, the run's tasks leave the queue,
/// and the queue's other runs are unaffected.
pub async fn an_unreadable_run_document_opens_one_incident_and_blocks_the_run<S: Store>(store: S, tamper: Tamper) {
    let garbled = started(&store, "garbled", "shared-q").await;
    let from_the_future = started(&store, "from-the-future", "shared-q").await;
    started(&store, "healthy", "shared-q").await;
    let mut newer = from_the_future.clone();
    newer.document_version = RUN_DOCUMENT_VERSION + 1;
    let cases = [
        (&garbled, r#"{"not": "a run"#.to_string()),
        (&from_the_future, serde_json::to_string(&newer).unwrap()),
    ];
    for (round, (run, document)) in cases.into_iter().enumerate() {
        tamper(run.run_id.0.clone(), document).await;
        let locator = RunLocator::Current(run.workflow_id.clone());
        let first = store.mutate_run("default", locator.clone(), NOW, |_, _| Ok(())).await;
        let Err(StoreError::Refused(refusal)) = first else {
            panic!("{}: expected a refusal, got {first:?}", run.workflow_id)
        };
        assert_eq!(refusal.reason, Reason::IntegrityIncidentOpen);
        assert_eq!(refusal.details.get("run_id"), Some(&json!(run.run_id.0)));
        let incident_id = refusal.details.get("incident_id").cloned().expect("the incident is named");
        let again = store.mutate_run("default", locator.clone(), NOW, |_, _| Ok(())).await;
        let Err(StoreError::Refused(again)) = again else {
            panic!("expected a refusal, got {again:?}")
        };
        assert_eq!(again.details.get("incident_id"), Some(&incident_id), "one incident per run");
        let open = store.integrity_incidents("default", Some("open".into())).await.unwrap();
        assert_eq!(open.len(), round + 1, "{open:?}");
        assert!(open.iter().any(|incident| incident.run_id == run.run_id));
        // A read answers with the same incident.
        let read = store.load_run("default", locator).await;
        let Err(StoreError::Refused(read)) = read else {
            panic!("expected a refusal, got {read:?}")
        };
        assert_eq!(read.details.get("incident_id"), Some(&incident_id));
    }
    // The blocked runs' tasks are passed by; the healthy one is leased.
    let (_, run) = store
        .claim_task("default", TaskKind::Workflow, "shared-q", &[], "w", 30_000, NOW, None)
        .await
        .unwrap()
        .expect("the healthy run's task");
    assert_eq!(run.workflow_id.0, "healthy");
    let none = store
        .claim_task("default", TaskKind::Workflow, "shared-q", &[], "w", 30_000, NOW, None)
        .await
        .unwrap();
    assert!(none.is_none(), "the unreadable runs offer nothing: {none:?}");
}

/// Keeps what a store tells its observer.
#[derive(Default)]
struct Heard {
    facts: std::sync::Mutex<Vec<Fact>>,
    commits: std::sync::Mutex<Vec<Commit>>,
}

impl Observer for Heard {
    fn committed(&self, facts: &[Fact]) {
        self.facts.lock().unwrap().extend_from_slice(facts);
    }
    fn commit(&self, commit: Commit) {
        self.commits.lock().unwrap().push(commit);
    }
}

impl Heard {
    fn take(&self) -> Vec<Fact> {
        std::mem::take(&mut *self.facts.lock().unwrap())
    }
}

pub async fn the_observer_hears_each_committed_fact_once_and_queues_are_measured<S: Store>(store: S) {
    let heard = std::sync::Arc::new(Heard::default());
    let store = store.with_observer(heard.clone());
    let started_fact = |_: &str| Fact::RunStarted {
        namespace: "default".into(),
        workflow_type: "suite.workflow".into(),
    };
    let first = started(&store, "seen-a", "loaded").await;
    started(&store, "seen-b", "loaded").await;
    assert_eq!(heard.take(), vec![started_fact("seen-a"), started_fact("seen-b")]);
    assert!(!heard.commits.lock().unwrap().is_empty(), "commits are timed");

    let loads = store.queue_loads(NOW + 2_000, 100).await.unwrap();
    let load = loads.iter().find(|l| l.queue == "loaded").expect("the queue is measured");
    assert_eq!((load.kind.as_str(), load.ready, load.leased), ("workflow", 2, 0), "{loads:?}");
    assert_eq!(load.oldest_ready_at, Some(NOW), "{loads:?}");
    assert!(
        store.queue_loads(NOW - 1, 100).await.unwrap().iter().all(|l| l.ready == 0),
        "work not yet available is not waiting"
    );

    // A lease that runs out is counted when the clock takes the task back, not before.
    store
        .claim_task("default", TaskKind::Workflow, "loaded", &[], "w1", 1_000, NOW, None)
        .await
        .unwrap()
        .expect("a task to lease");
    let loads = store.queue_loads(NOW, 100).await.unwrap();
    let load = loads.iter().find(|l| l.queue == "loaded").unwrap();
    assert_eq!((load.ready, load.leased), (1, 1), "{loads:?}");
    assert_eq!(store.queue_loads(NOW, 0).await.unwrap(), vec![], "at most `limit` queues");
    assert_eq!(heard.take(), vec![], "a lease is not a fact operators count");
    let due = store.claim_due_tasks("node-a", NOW + 5_000, 10, 30_000).await.unwrap();
    assert_eq!(due.len(), 1);
    let id = due[0].task_id.clone();
    store
        .run_duty(&due[0], NOW + 5_000, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await
        .unwrap();
    assert_eq!(
        heard.take(),
        vec![Fact::LeaseExpired {
            namespace: "default".into(),
            kind: TaskKind::Workflow
        }]
    );

    // A refused transition tells nothing; a close tells its reason, once.
    let refused = store
        .mutate_run("default", RunLocator::Current(first.workflow_id.clone()), NOW, |_, _| {
            Err::<(), _>(Refusal::new(Reason::RunClosed, "refused on purpose"))
        })
        .await;
    assert!(refused.is_err());
    assert_eq!(heard.take(), vec![]);
    for _ in 0..2 {
        let _ = store
            .mutate_run("default", RunLocator::Current(first.workflow_id.clone()), NOW, |run, cx| {
                close_by_command(run, cx, CloseCommand::Terminate, None, "t".into())
            })
            .await;
    }
    assert_eq!(
        heard.take(),
        vec![Fact::RunClosed {
            namespace: "default".into(),
            workflow_type: "suite.workflow".into(),
            reason: "terminated",
        }],
        "the second terminate is refused: one close, one fact"
    );
    let pool = store.pool_use();
    assert!(pool.max >= 1 && pool.idle <= pool.open, "{pool:?}");

    // A timer is counted when the clock fires it.
    started(&store, "seen-timer", "timed").await;
    complete_next(&store, "timed", vec![timer(1)]).await;
    heard.take();
    let due = store.claim_due_tasks("node-a", NOW + 1_000, 10, 30_000).await.unwrap();
    let timer_task = due.iter().find(|d| d.namespace == "default").expect("the timer is due").clone();
    let id = timer_task.task_id.clone();
    store
        .run_duty(&timer_task, NOW + 1_000, move |run, cx| Ok(on_deadline(run, cx, &id)))
        .await
        .unwrap();
    assert!(
        heard.take().contains(&Fact::TimerFired {
            namespace: "default".into()
        }),
        "a fired timer is a fact"
    );
}
