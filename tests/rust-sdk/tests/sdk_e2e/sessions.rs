//! The Rust SDK's worker sessions against Capstan: what the crate's `worker_sessions` example
//! does, with its outcome checked.

use super::*;
use durable_workflow::{Uuid, WorkerSessionOptions};
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
