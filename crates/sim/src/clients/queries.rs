//! Queries in the workload: a client queries an instance, which makes a query task for a
//! worker and never touches the run's history; the instance's audit trail names who asked.

use crate::report::Failure;
use crate::workload::{NAMESPACE, SIMULATED_CLIENT};
use crate::world::{pick, Acted, World};
use capstan_app::queries;
use capstan_engine::Principal;
use capstan_store::RunStore;
use serde_json::Value;

/// How long a query waits for its answer.
const QUERY_WAIT_MS: i64 = 10_000;

/// A client queries a workflow: a query task for a worker, which never touches history.
pub(crate) async fn send_query(world: &mut World) -> Result<Acted, Failure> {
    let Some(workflow_id) = pick(&mut world.rng, world.seen.instances.iter()) else {
        return Ok(Acted::Idle);
    };
    let request = queries::QueryRequest {
        namespace: NAMESPACE.into(),
        workflow_id: workflow_id.clone(),
        run_id: None,
        query_name: "status".into(),
        arguments: None,
        wait_ms: QUERY_WAIT_MS,
        principal: Some(Principal::token(SIMULATED_CLIENT)),
    };
    let before = world.current_run(&workflow_id).await?.map(|run| (run.last_sequence, run.last_hash));
    let put = queries::put_query(&world.app, request).await;
    let Some((task, _)) = world.declined(put)? else {
        return Ok(Acted::Done);
    };
    let id = task.id.clone();
    world.trace(|| format!("query status of {workflow_id} (query task {id})"));
    world.seen.queries.insert(id.clone(), false);
    if world.query_run_head(&id).await? != before {
        return Err(world.fail(format!("query {id} changed the history of {workflow_id}")));
    }
    check_query_audited(world, &workflow_id, &id).await?;
    Ok(Acted::Done)
}

/// A query writes no history: the instance's audit trail names who asked it.
async fn check_query_audited(world: &World, workflow_id: &str, query_task_id: &str) -> Result<(), Failure> {
    let trail = world
        .store()
        .audit_events(NAMESPACE, workflow_id, None, 100_000)
        .await
        .map_err(|e| world.fail(format!("audit: {e}")))?;
    let asked = trail
        .iter()
        .filter(|event| event.detail.get("query_task_id").and_then(Value::as_str) == Some(query_task_id))
        .map(|event| event.principal.clone())
        .collect::<Vec<_>>();
    match asked.as_slice() {
        [Some(principal)] if principal.id == SIMULATED_CLIENT => Ok(()),
        other => Err(world.fail(format!("query {query_task_id} of {workflow_id}: audit trail records {other:?}"))),
    }
}
