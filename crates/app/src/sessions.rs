//! Worker sessions a worker asks for, renews and closes (`/worker/sessions`); activities in a
//! session are admitted when a poller claims them (`capstan_store` claim logic), and an
//! activity heartbeat renews its session.

use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{SessionAnswer, SessionStep};

/// Creates, reuses or takes over `options.session_id` for `worker_id`.
pub async fn acquire<V: Services>(services: &V, namespace: &str, worker_id: &str, options: SessionOptions) -> AppResult<SessionAnswer> {
    let session_id = options.session_id.clone();
    step(services, namespace, &session_id, worker_id, SessionStep::Acquire(options)).await
}

/// The holder renews the session's lease (never its TTL).
pub async fn heartbeat<V: Services>(
    services: &V,
    namespace: &str,
    session_id: &str,
    worker_id: &str,
    lease_seconds: Option<i64>,
) -> AppResult<SessionAnswer> {
    capstan_pause::point(capstan_pause::SESSION_RENEWING);
    step(services, namespace, session_id, worker_id, SessionStep::Heartbeat(lease_seconds)).await
}

/// The holder closes the session, saying why: it is over for good.
pub async fn close<V: Services>(
    services: &V,
    namespace: &str,
    session_id: &str,
    worker_id: &str,
    reason: Option<String>,
) -> AppResult<SessionAnswer> {
    step(services, namespace, session_id, worker_id, SessionStep::Close(reason)).await
}

/// An activity attempt's heartbeat renews the session it runs in: answers what the
/// heartbeat reply carries (`worker_session`), or `None` when the activity has no session.
pub async fn renew_for_activity<V: Services>(
    services: &V,
    run: &RunState,
    task_id: &TaskId,
    worker_id: &str,
) -> AppResult<Option<serde_json::Value>> {
    let Some(requirement) = session_of_task(run, task_id) else {
        return Ok(None);
    };
    // A session lease less than a third used is confirmed as it stands (a read): renewals and
    // heartbeats come every few seconds, and each would otherwise write the session row.
    let session_id = &requirement.options.session_id;
    if let Some(session) = services.store().get_session(&run.namespace, session_id).await? {
        let now = services.now();
        let lease_ms = session.options.lease_seconds * 1000;
        let fresh = session.status == SessionStatus::Active
            && session.lease_owner == worker_id
            && session.lease_expires_at - now >= lease_ms * 2 / 3
            && now < session.ttl_expires_at;
        if fresh {
            return Ok(Some(session.task_view(&requirement.as_sent)));
        }
    }
    let answer = heartbeat(services, &run.namespace, session_id, worker_id, None).await?;
    Ok(Some(answer.session.task_view(&requirement.as_sent)))
}

/// The session an activity task runs in, if its activity asked for one.
pub fn session_of_task<'r>(run: &'r RunState, task_id: &TaskId) -> Option<&'r SessionRequirement> {
    run.session_of(run.tasks.get(task_id)?)
}

async fn step<V: Services>(
    services: &V,
    namespace: &str,
    session_id: &str,
    worker_id: &str,
    step: SessionStep,
) -> AppResult<SessionAnswer> {
    let answer = services
        .store()
        .session_step(namespace, session_id, worker_id, step, services.now())
        .await?;
    tracing::info!(
        namespace,
        session_id,
        worker_id,
        outcome = answer.outcome,
        fence = answer.session.fence,
        "worker session"
    );
    Ok(answer)
}
