//! Suite checks of schedules: every occurrence fires once, with its workflow.

use super::*;

pub async fn schedules_fire_each_occurrence_once_with_their_workflows<S: Store + Clone>(store: S) {
    use capstan_engine::schedule::{OverlapPolicy, Schedule, ScheduleFields};
    const MINUTE: Millis = 60_000;
    // NOW is a whole minute: the first occurrence is one minute later.
    let first = NOW + MINUTE;
    let spec = json!({"intervals": [{"every": "PT1M"}]}).as_object().unwrap().clone();
    let action = json!({"workflow_type": "suite.scheduled", "task_queue": "sq"})
        .as_object()
        .unwrap()
        .clone();
    let fields = ScheduleFields {
        overlap_policy: Some(OverlapPolicy::Skip),
        ..Default::default()
    };
    let schedule = Schedule::create("default", "every-minute", spec, &action, fields, false, NOW).unwrap();
    store.create_schedule(schedule.clone()).await.unwrap();
    let again = store.create_schedule(schedule.clone()).await.unwrap_err();
    assert!(
        matches!(again, StoreError::Refused(ref r) if r.reason == Reason::ScheduleAlreadyExists),
        "{again:?}"
    );
    assert_eq!(store.next_schedule_wake().await.unwrap(), Some(first));
    assert!(store.due_schedules(first - 1, 10).await.unwrap().is_empty());
    assert_eq!(
        store.due_schedules(first, 10).await.unwrap(),
        vec![("default".to_string(), "every-minute".to_string())]
    );

    let due = || ScheduleFire::Due {
        catchup_window_ms: 10 * MINUTE,
    };
    let empty = Payload::avro("AA==");
    // Eight evaluations of the same due occurrence, concurrently: one start.
    let fires = (0..8).map(|_| {
        let (store, fire, empty) = (store.clone(), due(), empty.clone());
        async move {
            store
                .fire_schedule("default", "every-minute", fire, empty, first)
                .await
                .unwrap()
                .started
        }
    });
    assert_eq!(
        futures_join(fires.collect()).await.iter().sum::<usize>(),
        1,
        "an occurrence fires exactly once"
    );
    let fired = store.schedule("default", "every-minute").await.unwrap().unwrap();
    assert_eq!(fired.fires_count, 1);
    let workflow_id = fired.latest_workflow_id.clone().unwrap();
    let run = store
        .load_run("default", RunLocator::Current(WorkflowId(workflow_id.clone())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run.workflow_type.as_str(), run.task_queue.as_str()), ("suite.scheduled", "sq"));

    // The started run is still open: under `skip` the next occurrence is skipped.
    let report = store
        .fire_schedule("default", "every-minute", due(), empty.clone(), first + MINUTE)
        .await
        .unwrap();
    assert_eq!(report.started, 0);
    assert_eq!(
        store
            .schedule("default", "every-minute")
            .await
            .unwrap()
            .unwrap()
            .skipped_trigger_count,
        1
    );

    // Under `terminate_other` the open run is terminated in the same transaction.
    store
        .change_schedule("default", "every-minute", move |s| {
            s.update(
                ScheduleFields {
                    overlap_policy: Some(OverlapPolicy::TerminateOther),
                    ..Default::default()
                },
                first + MINUTE,
            )
            .map_err(|e| Refusal::new(Reason::InvalidCommands, e.message))
        })
        .await
        .unwrap();
    let report = store
        .fire_schedule("default", "every-minute", due(), empty.clone(), first + 2 * MINUTE + 1_500)
        .await
        .unwrap();
    assert_eq!(report.started, 1);
    assert_eq!(report.lateness_ms, vec![1_500], "started 1.5 s after its occurrence");
    let previous = store
        .load_run("default", RunLocator::Current(WorkflowId(workflow_id)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(previous.status, RunStatus::Terminated);

    triggers_pauses_and_deletion(&store, schedule, first, &empty).await;
}

/// The rest of a schedule's life: a manual trigger, a pause, listing, deletion with the history
/// that outlives it, and a re-creation that continues that history.
async fn triggers_pauses_and_deletion<S: Store>(store: &S, schedule: capstan_engine::schedule::Schedule, first: Millis, empty: &Payload) {
    use capstan_engine::schedule::OverlapPolicy;
    const MINUTE: Millis = 60_000;
    // Manual trigger and pause.
    let manual = store
        .fire_schedule(
            "default",
            "every-minute",
            ScheduleFire::Manual {
                policy: Some(OverlapPolicy::AllowAll),
                principal: Some(Principal::token("alice")),
            },
            empty.clone(),
            first + 2 * MINUTE + 5,
        )
        .await
        .unwrap();
    assert_eq!(manual.outcome, "triggered");
    store
        .change_schedule("default", "every-minute", move |s| {
            s.acting_as(Some(Principal::token("bob")));
            s.pause(Some("quiet".into()), first + 2 * MINUTE + 10);
            Ok(())
        })
        .await
        .unwrap();
    // Who made each change: the trigger's event and the run it started name alice, the pause
    // bob, the scheduler's own firings no one.
    let events = store.schedule_history("default", "every-minute", 0, 100).await.unwrap().unwrap();
    let who = |event_type: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e.event_type == event_type)
            .map(|e| e.payload["principal"].clone())
            .collect()
    };
    let (alice, bob) = (Principal::token("alice").to_json(), Principal::token("bob").to_json());
    assert_eq!(who("ScheduleTriggered").last(), Some(&alice), "{events:?}");
    assert_eq!(who("SchedulePaused"), vec![bob]);
    assert!(who("ScheduleTriggered").first().is_some_and(Value::is_null), "{events:?}");
    let triggered = store
        .load_run("default", RunLocator::Current(WorkflowId(manual.workflow_id.clone().unwrap())))
        .await
        .unwrap()
        .unwrap();
    let started = store.history(&triggered.run_id, 0, 10, 10).await.unwrap();
    let started = started.iter().find(|e| e.event_type == EventType::WorkflowStarted).unwrap();
    assert_eq!(started.payload["principal"], alice);
    assert!(
        store.due_schedules(first + 10 * MINUTE, 10).await.unwrap().is_empty(),
        "a paused schedule is never due"
    );
    let paused = store
        .fire_schedule(
            "default",
            "every-minute",
            ScheduleFire::Manual {
                policy: None,
                principal: None,
            },
            empty.clone(),
            first + 3 * MINUTE,
        )
        .await
        .unwrap();
    assert_eq!(
        (paused.outcome.as_str(), paused.reason.as_deref()),
        ("skipped", Some("status_not_triggerable"))
    );

    // Listing, deletion, and the history that outlives it.
    assert_eq!(
        store
            .list_schedules(
                "default",
                ScheduleFilter {
                    limit: 10,
                    ..Default::default()
                }
            )
            .await
            .unwrap()
            .len(),
        1
    );
    store
        .change_schedule("default", "every-minute", move |s| {
            s.delete("deleted", first + 4 * MINUTE);
            Ok(())
        })
        .await
        .unwrap();
    assert!(store.schedule("default", "every-minute").await.unwrap().is_none());
    assert!(store
        .list_schedules(
            "default",
            ScheduleFilter {
                limit: 10,
                ..Default::default()
            }
        )
        .await
        .unwrap()
        .is_empty());
    let missing = store.change_schedule("default", "every-minute", |_| Ok(())).await.unwrap_err();
    assert!(matches!(missing, StoreError::Refused(ref r) if r.reason == Reason::ScheduleNotFound));
    let history = store.schedule_history("default", "every-minute", 0, 100).await.unwrap().unwrap();
    let types: Vec<&str> = history.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "ScheduleCreated",
            "ScheduleTriggered",
            "ScheduleTriggerSkipped",
            "ScheduleUpdated",
            "ScheduleTriggered",
            "ScheduleTriggered",
            "SchedulePaused",
            "ScheduleDeleted"
        ]
    );
    assert_eq!(
        history.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<i64>>()
    );
    assert!(history[1].workflow_id.is_some() && history[1].run_id.is_some());
    let page = store.schedule_history("default", "every-minute", 6, 1).await.unwrap().unwrap();
    assert_eq!(page.iter().map(|e| e.sequence).collect::<Vec<_>>(), [7]);
    assert!(store.schedule_history("default", "never", 0, 10).await.unwrap().is_none());
    // A deleted id may be created again; its history continues.
    let mut again = schedule;
    again.pending_events.truncate(1);
    store.create_schedule(again).await.unwrap();
    let history = store.schedule_history("default", "every-minute", 8, 10).await.unwrap().unwrap();
    assert_eq!(
        history.iter().map(|e| (e.sequence, e.event_type.as_str())).collect::<Vec<_>>(),
        [(9, "ScheduleCreated")]
    );
}
