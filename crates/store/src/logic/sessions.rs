//! Worker sessions: each step on a session (acquire, heartbeat, close) locks its row, refreshes
//! it against the clock and its holder's registration, lets the engine decide, and writes it
//! back in the same transaction. Activity admission runs the same acquire inside the claim.

use crate::tx::{args, locking, Locking, Tx};
use crate::*;
use capstan_engine::session::{acquire_session, close_session, heartbeat_session};

const LOCK_SESSION: Locking = locking!(
    "SELECT document FROM worker_sessions WHERE namespace = $1 AND session_id = $2",
    "FOR UPDATE"
);
const UPSERT_SESSION: &str =
    "INSERT INTO worker_sessions (namespace, session_id, lease_owner, status, lease_expires_at, ttl_expires_at, allow_reacquire, document)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (namespace, session_id) DO UPDATE SET lease_owner = excluded.lease_owner, status = excluded.status,
       lease_expires_at = excluded.lease_expires_at, ttl_expires_at = excluded.ttl_expires_at,
       allow_reacquire = excluded.allow_reacquire, document = excluded.document";
const HELD_BY: &str = "SELECT COUNT(*) FROM worker_sessions WHERE namespace = $1 AND lease_owner = $2 AND status = 'active'
     AND lease_expires_at > $3 AND ttl_expires_at > $3 AND session_id <> $4";
const RUNNING_IN: &str = "SELECT COUNT(*) FROM tasks WHERE namespace = $1 AND session_id = $2 AND kind = 'activity'
     AND status = 'leased' AND lease_expires_at > $3 AND task_id <> $4";

/// What is asked of a session.
#[derive(Clone, Debug)]
pub enum SessionStep {
    Acquire(SessionOptions),
    /// Renew the lease (`lease_seconds`, else the session's own).
    Heartbeat(Option<i64>),
    /// Close it, with the holder's reason.
    Close(Option<String>),
}

/// What a step did: the session after it, and its outcome (`created`, `reused`,
/// `reacquired`, `heartbeat_recorded`, `closed`, `already_closed`).
#[derive(Clone, Debug)]
pub struct SessionAnswer {
    pub session: WorkerSession,
    pub outcome: &'static str,
}

pub(crate) async fn get_session<T: Tx>(tx: &mut T, namespace: &str, session_id: &str) -> StoreResult<Option<WorkerSession>> {
    let row = tx.query_opt(LOCK_SESSION.unlocked(), &args![namespace, session_id]).await?;
    row.map(|row| Ok(serde_json::from_str(row.str(0)?)?)).transpose()
}

async fn locked_session<T: Tx>(tx: &mut T, namespace: &str, session_id: &str, now: Millis) -> StoreResult<Option<WorkerSession>> {
    let row = tx.query_opt(LOCK_SESSION.sql(tx.dialect()), &args![namespace, session_id]).await?;
    let Some(row) = row else { return Ok(None) };
    let mut session: WorkerSession = serde_json::from_str(row.str(0)?)?;
    let holder = tx
        .query_opt(
            "SELECT 1 FROM workers WHERE namespace = $1 AND worker_id = $2",
            &args![namespace, &session.lease_owner],
        )
        .await?;
    session.refresh(holder.is_some(), now);
    Ok(Some(session))
}

async fn save_session<T: Tx>(tx: &mut T, session: &WorkerSession) -> StoreResult<()> {
    let document = serde_json::to_string(session)?;
    let args = args![
        &session.namespace,
        &session.options.session_id,
        &session.lease_owner,
        session.status.as_str(),
        session.lease_expires_at,
        session.ttl_expires_at,
        i64::from(session.options.allow_reacquire_after_failure),
        document.as_str(),
    ];
    tx.execute(UPSERT_SESSION, &args).await.map(drop)
}

/// The registered worker asking, with what it may hold.
async fn claimant<T: Tx>(tx: &mut T, namespace: &str, worker_id: &str, session_id: &str, now: Millis) -> StoreResult<SessionClaimant> {
    let worker = super::fleet::get_worker(tx, namespace, worker_id).await?.ok_or_else(|| {
        StoreError::Refused(
            Refusal::new(Reason::WorkerNotRegistered, "Register the worker before using sessions.").with("worker_id", worker_id),
        )
    })?;
    let held = tx.query(HELD_BY, &args![namespace, worker_id, now, session_id]).await?;
    let capabilities = worker
        .document
        .get("capabilities")
        .and_then(Value::as_array)
        .map(|caps| caps.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    Ok(SessionClaimant {
        worker_id: worker.worker_id,
        task_queue: worker.task_queue,
        capabilities,
        max_sessions: worker.document.get("max_concurrent_worker_sessions").and_then(Value::as_i64),
        sessions_held: held.first().map(|r| r.int(0)).transpose()?.unwrap_or(0),
    })
}

/// One step on `(namespace, session_id)` by `worker_id`, committed with the caller's
/// transaction; a refusal writes nothing.
pub(crate) async fn session_step<T: Tx>(
    tx: &mut T,
    namespace: &str,
    session_id: &str,
    worker_id: &str,
    step: SessionStep,
    now: Millis,
) -> StoreResult<SessionAnswer> {
    let existing = locked_session(tx, namespace, session_id, now).await?;
    let answer = match step {
        SessionStep::Acquire(options) => {
            let who = claimant(tx, namespace, worker_id, session_id, now).await?;
            let (session, outcome) = acquire_session(existing, namespace, options, &who, None, now)?;
            SessionAnswer {
                session,
                outcome: outcome.as_str(),
            }
        }
        SessionStep::Heartbeat(lease_seconds) => SessionAnswer {
            session: heartbeat_session(existing.ok_or_else(|| not_found(session_id))?, worker_id, lease_seconds, now)?,
            outcome: "heartbeat_recorded",
        },
        SessionStep::Close(reason) => {
            let (session, outcome) = close_session(existing.ok_or_else(|| not_found(session_id))?, worker_id, reason, now)?;
            SessionAnswer { session, outcome }
        }
    };
    save_session(tx, &answer.session).await?;
    Ok(answer)
}

fn not_found(session_id: &str) -> Refusal {
    Refusal::new(Reason::SessionNotFound, "No such worker session.").with("session_id", session_id)
}

/// Admits one attempt of a session activity for `worker_id` in the claim transaction: the
/// session is created, renewed or taken over, and may run one more activity. `None`: not
/// admitted now (the task stays ready for a worker that may run it).
pub(crate) async fn admit_activity<T: Tx>(
    tx: &mut T,
    namespace: &str,
    requirement: &SessionRequirement,
    task_id: &TaskId,
    worker_id: &str,
    now: Millis,
) -> StoreResult<Option<WorkerSession>> {
    let session_id = requirement.options.session_id.as_str();
    let existing = locked_session(tx, namespace, session_id, now).await?;
    let who = claimant(tx, namespace, worker_id, session_id, now).await?;
    let running = tx.query(RUNNING_IN, &args![namespace, session_id, now, task_id.as_str()]).await?;
    let running = running.first().map(|r| r.int(0)).transpose()?.unwrap_or(0);
    match acquire_session(existing, namespace, requirement.options.clone(), &who, Some(running), now) {
        Ok((session, outcome)) => {
            if outcome != capstan_engine::AcquireOutcome::Reused {
                tracing::info!(
                    namespace,
                    session_id,
                    worker_id,
                    outcome = outcome.as_str(),
                    fence = session.fence,
                    "worker session taken with an activity"
                );
            }
            save_session(tx, &session).await?;
            Ok(Some(session))
        }
        Err(refusal) => {
            tracing::debug!(session_id, worker_id, %refusal, "session activity not admitted for this worker");
            Ok(None)
        }
    }
}
