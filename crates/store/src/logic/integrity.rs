//! Integrity incidents: opened (in a transaction of its own) when a change found a broken
//! ledger chain, which blocks the run; closed by an operator once the chain verifies again.

use super::locate::lock_run;
use super::persist::persist;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;

const INSERT_INCIDENT: &str =
    "INSERT INTO integrity_incidents (incident_id, namespace, workflow_id, run_id, state, opened_at, doc) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const LOCK_INCIDENT: Locking = locking!(
    "SELECT doc FROM integrity_incidents WHERE namespace = $1 AND incident_id = $2",
    "FOR UPDATE"
);
const INSTANCE_CHECKPOINTS: &str = "SELECT doc FROM ledger_checkpoints WHERE namespace = $1 AND workflow_id = $2";
const CLOSE_INCIDENT: &str = "UPDATE integrity_incidents SET state = 'closed', doc = $2 WHERE incident_id = $1";

/// Writes a new open incident for `breach`.
async fn open_incident<T: Tx>(tx: &mut T, breach: &IntegrityBreach, opened_at: Millis, env: &Env) -> StoreResult<IntegrityIncident> {
    let incident = IntegrityIncident {
        incident_id: env.new_id(),
        namespace: breach.namespace.clone(),
        workflow_id: breach.workflow_id.clone(),
        run_id: breach.run_id.clone(),
        state: "open".into(),
        detail: breach.detail.clone(),
        opened_at,
        closed_at: None,
        note: None,
    };
    let doc = serde_json::to_string(&incident)?;
    let args = args![
        &incident.incident_id,
        &incident.namespace,
        incident.workflow_id.as_str(),
        incident.run_id.as_str(),
        &incident.state,
        incident.opened_at,
        doc.as_str(),
    ];
    tx.execute(INSERT_INCIDENT, &args).await?;
    Ok(incident)
}

/// Opens an incident for `breach` and blocks its run; the refusal the failed change answers.
/// A run already blocked keeps its open incident.
pub(crate) async fn record_breach<T: Tx>(tx: &mut T, breach: &IntegrityBreach, opened_at: Millis, env: &Env) -> StoreResult<Refusal> {
    let run = lock_run(tx, breach.run_id.as_str(), false).await?;
    if let Some(open) = run.as_ref().and_then(|r| r.integrity_incident.clone()) {
        return Ok(
            Refusal::new(Reason::IntegrityIncidentOpen, "The run is blocked by an open integrity incident.").with("incident_id", open),
        );
    }
    tracing::error!(namespace = %breach.namespace, workflow_id = %breach.workflow_id, run_id = %breach.run_id, detail = %breach.detail, "integrity incident opened");
    let incident = open_incident(tx, breach, opened_at, env).await?;
    if let Some(mut run) = run {
        let mut ids = env.ids();
        let mut cx = env.cx(incident.opened_at, &mut ids);
        block_for_integrity(&mut run, &mut cx, &incident.incident_id);
        let effects = cx.effects;
        persist(tx, &run, &effects, false, env).await?;
    }
    Ok(Refusal::new(
        Reason::IntegrityIncidentOpen,
        "A ledger chain this change extends failed verification; an integrity incident is open and the run is blocked.",
    )
    .with("incident_id", incident.incident_id)
    .with("workflow_id", breach.workflow_id.as_str()))
}

/// Closes an open incident if the instance's chain verifies now, and unblocks its run.
pub(crate) async fn close_incident<T: Tx>(
    tx: &mut T,
    namespace: &str,
    incident_id: &str,
    note: String,
    now: Millis,
    env: &Env,
) -> StoreResult<IntegrityIncident> {
    let row = tx
        .query_opt(LOCK_INCIDENT.sql(tx.dialect()), &args![namespace, incident_id])
        .await?;
    let Some(row) = row else {
        return Err(Refusal::new(Reason::IntegrityIncidentNotFound, "No such integrity incident.")
            .with("incident_id", incident_id)
            .into());
    };
    let mut incident: IntegrityIncident = serde_json::from_str(row.str(0)?)?;
    if incident.state != "open" {
        return Ok(incident);
    }
    let rows = tx
        .query(INSTANCE_CHECKPOINTS, &args![namespace, incident.workflow_id.as_str()])
        .await?;
    let checkpoints = rows
        .iter()
        .map(|row| Ok(serde_json::from_str::<LedgerCheckpoint>(row.str(0)?)?))
        .collect::<StoreResult<Vec<_>>>()?;
    if let Err(index) = ledger::verify_checkpoints(&chain_order(checkpoints)) {
        return Err(Refusal::new(
            Reason::IntegrityChainBroken,
            "The instance's ledger chain still fails verification.",
        )
        .with("incident_id", incident_id)
        .with("broken_at", index)
        .into());
    }
    incident.state = "closed".into();
    incident.closed_at = Some(now);
    incident.note = Some(note);
    let doc = serde_json::to_string(&incident)?;
    tx.execute(CLOSE_INCIDENT, &args![incident_id, doc.as_str()]).await?;
    if let Some(mut run) = lock_run(tx, incident.run_id.as_str(), false).await? {
        if run.integrity_incident.as_deref() == Some(incident.incident_id.as_str()) {
            let mut ids = env.ids();
            let mut cx = env.cx(now, &mut ids);
            clear_integrity_block(&mut run, &mut cx);
            let effects = cx.effects;
            persist(tx, &run, &effects, false, env).await?;
        }
    }
    Ok(incident)
}

const OPEN_INCIDENT_OF_RUN: &str = "SELECT incident_id FROM integrity_incidents WHERE run_id = $1 AND state = 'open'";
const BLOCK_READY_TASKS: &str = "UPDATE tasks SET status = 'blocked' WHERE run_id = $1 AND status = 'ready'";

/// A run whose document cannot be read: open an incident naming it (once) and take its ready
/// tasks off the queues, since no transition can run on it; the refusal the request answers.
/// The engine cannot mark the document itself, so the block lives in the task rows.
pub(crate) async fn record_unreadable_run<T: Tx>(
    tx: &mut T,
    breach: &IntegrityBreach,
    opened_at: Millis,
    env: &Env,
) -> StoreResult<Refusal> {
    let refusal = |incident_id: String| {
        Refusal::new(
            Reason::IntegrityIncidentOpen,
            "The run's stored document cannot be read; an integrity incident is open and the run is blocked.",
        )
        .with("incident_id", incident_id)
        .with("workflow_id", breach.workflow_id.as_str())
        .with("run_id", breach.run_id.as_str())
        .with("detail", breach.detail.clone())
    };
    if let Some(open) = tx.query_opt(OPEN_INCIDENT_OF_RUN, &args![breach.run_id.as_str()]).await? {
        return Ok(refusal(open.text(0)?));
    }
    tracing::error!(namespace = %breach.namespace, workflow_id = %breach.workflow_id, run_id = %breach.run_id, detail = %breach.detail, "unreadable run document: integrity incident opened");
    let incident = open_incident(tx, breach, opened_at, env).await?;
    tx.execute(BLOCK_READY_TASKS, &args![breach.run_id.as_str()]).await?;
    Ok(refusal(incident.incident_id))
}
