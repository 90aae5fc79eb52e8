//! The Rust SDK's worker sessions against Capstan: what the crate's `worker_sessions` example
//! does, with its outcome checked.

use super::*;
use durable_workflow::{Uuid, Worker, WorkerSessionOptions};
use std::collections::HashMap;

#[derive(Clone, Debug, Deserialize, Serialize)]
struct SessionRequest {
    name: String,
    session_id: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
struct SessionGreeting {
    greeting: String,
    resource_generation: String,
    holder: String,
}

/// Two activities in one session run on the worker that holds it (their process-local
/// resource is the same), the session survives the activities' heartbeats and replay, and the
/// worker closes it on shutdown (the run ends only if every step of that is accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_activities_share_their_holder_and_the_session_closes_at_shutdown() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("session-q");
    let worker_id = unique("session-worker");
    let mut worker = new_worker(&client, &queue)
        .worker_id(worker_id.clone())
        .worker_sessions(true)
        .capabilities(["cache:e2e"]);
    let resources = Arc::new(Mutex::new(HashMap::<String, String>::new()));
    let holder = worker_id.clone();
    worker.register_typed_activity("e2e.session-greet", move |ctx, request: SessionRequest| {
        let (resources, holder) = (resources.clone(), holder.clone());
        async move {
            let session = ctx.worker_session().expect("the task carries its session");
            let resource_generation = resources
                .lock()
                .unwrap()
                .entry(session.options().session_id().into())
                .or_insert_with(|| Uuid::new_v4().to_string())
                .clone();
            ctx.heartbeat(json!({"phase": "resource_ready"})).await?;
            Ok(SessionGreeting {
                greeting: format!("Hello, {}!", request.name),
                resource_generation,
                holder,
            })
        }
    });
    worker.register_typed_workflow("e2e.session", |ctx, request: SessionRequest| async move {
        let options = WorkerSessionOptions::new(&request.session_id).requirements(["cache:e2e"]);
        let first: SessionGreeting = ctx
            .activity("e2e.session-greet", json!(request))
            .in_worker_session(options.clone())
            .typed()
            .await?;
        let second: SessionGreeting = ctx
            .activity("e2e.session-greet", json!(request))
            .in_worker_session(options)
            .typed()
            .await?;
        Ok(vec![first, second])
    });
    let mut running = RunningWorker::start(worker);
    let session_id = unique("session");
    let request = SessionRequest {
        name: "Capstan".into(),
        session_id: session_id.clone(),
    };
    let handle = start(&client, "e2e.session", &queue, &unique("session-wf"), request).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("session workflow did not complete: {error} ({error:?})"));
    let greetings: Vec<SessionGreeting> = serde_json::from_value(result.clone()).expect("two greetings");
    assert_eq!(greetings.len(), 2, "{result}");
    assert_eq!(
        greetings[0].resource_generation, greetings[1].resource_generation,
        "one holder, one resource"
    );
    assert!(greetings.iter().all(|g| g.holder == worker_id && g.greeting == "Hello, Capstan!"));
    // The recorded step carries the session exactly as the workflow sent it.
    let run_id = run_id_of(&handle).await;
    let events = server.history_events(&handle.workflow_id, &run_id).await;
    let scheduled: Vec<&Value> = events.iter().filter(|e| e["event_type"] == "ActivityScheduled").collect();
    assert_eq!(scheduled.len(), 2);
    for event in scheduled {
        assert_eq!(event["payload"]["worker_session"]["session_id"], session_id.as_str());
        assert!(
            event["payload"]["worker_session"].get("queue").is_none(),
            "nothing added to what was sent"
        );
    }
    // Shutdown closes the session it held (a refused close fails the shutdown).
    running.shutdown().await;
}

/// A session worker that records which worker ran each session step.
fn session_step_worker(client: &Client, queue: &str, worker_id: &str) -> Worker {
    let mut worker = new_worker(client, queue)
        .worker_id(worker_id.to_string())
        .worker_sessions(true)
        .capabilities(["cache:e2e"]);
    let holder = worker_id.to_string();
    worker.register_typed_activity("e2e.session-step", move |ctx, _step: u32| {
        let holder = holder.clone();
        async move {
            ctx.worker_session().expect("the task carries its session");
            Ok(holder)
        }
    });
    worker.register_typed_workflow("e2e.session-steps", |ctx, session_id: String| async move {
        let options = WorkerSessionOptions::new(&session_id)
            .requirements(["cache:e2e"])
            .lease_seconds(3)
            .allow_reacquire_after_failure(true);
        let first: String = ctx
            .activity("e2e.session-step", json!(1))
            .in_worker_session(options.clone())
            .typed()
            .await?;
        ctx.wait_signal("go").await?;
        let second: String = ctx
            .activity("e2e.session-step", json!(2))
            .in_worker_session(options)
            .typed()
            .await?;
        Ok(vec![first, second])
    });
    worker
        .declare_workflow_signals("e2e.session-steps", &["go"])
        .expect("declare signals");
    worker
}

/// The session's holder crashes (its loop dropped mid-flight: no deregistration, no close)
/// between two session steps: once the session's lease runs out, the other worker reacquires
/// it (`allow_reacquire_after_failure`) and runs the next step; every step ran on whoever held
/// the session at the time.
///
/// The holder's long poll may still be open at the server when the signal lands, so the
/// signal's workflow task can be leased to the dead holder (the server cannot tell that the
/// response will never be read); a short workflow task lease lets it reach the rival well
/// inside the result wait instead of after the default 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_holders_session_is_reacquired_by_another_worker() {
    let server = CapstanServer::spawn_with(&["--workflow-task-lease-seconds", "3"]).await;
    let client = server.client();
    let queue = unique("session-handoff-q");
    let (holder_id, rival_id) = (unique("holder"), unique("rival"));
    // The holder gets a client of its own: a pooled connection opened on its runtime dies with
    // it, and a shared pool would hand that dead connection to the rival ("dispatch task gone").
    let holder_client = server.client();
    let holder = super::support::IsolatedWorker::start(session_step_worker(&holder_client, &queue, &holder_id));
    let session_id = unique("session");
    let workflow_id = unique("session-handoff");
    let handle = start(&client, "e2e.session-steps", &queue, &workflow_id, json!(session_id)).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "SignalWaitOpened", RESULT_TIMEOUT)
        .await;
    let mut rival = RunningWorker::start(session_step_worker(&client, &queue, &rival_id));
    holder.crash();
    within(CALL_TIMEOUT, "signal", handle.signal("go", json!([])))
        .await
        .expect("signal");
    let result = rival
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("session workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!([holder_id, rival_id]));
    rival.shutdown().await;
}
