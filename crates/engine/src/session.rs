//! Worker sessions: a named lease on one worker process, so that a sequence of activities runs
//! where the resources they share live (a loaded model, a local cache, a scratch directory).
//!
//! A session is held by one worker (`lease_owner`) until its lease lapses (renewed by session
//! and activity heartbeats) or its TTL ends (never extended). A lapsed session, or one whose
//! holder is gone, may be reacquired by another capable worker when the options allow it; a
//! closed or TTL-expired session is over for good. Every change of holder raises `fence`, so a
//! former holder's heartbeat or close is refused. Activities scheduled with a
//! `worker_session` are offered only to the holder (or to a worker that may take the session
//! over), and admitting one renews the session inside the claim transaction.

use crate::refusal::{Reason, Refusal};
use crate::timefmt::iso8601;
use crate::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The options a session is asked for with (`POST /worker/sessions`, `schedule_activity`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionOptions {
    pub session_id: String,
    pub queue: Option<String>,
    pub connection: Option<String>,
    pub requirements: Vec<String>,
    pub lease_seconds: i64,
    pub ttl_seconds: i64,
    pub max_concurrent_activities: i64,
    pub create_if_missing: bool,
    pub allow_reacquire_after_failure: bool,
}

impl SessionOptions {
    /// DW's defaults for everything but the id.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            queue: None,
            connection: None,
            requirements: Vec::new(),
            lease_seconds: 120,
            ttl_seconds: 1800,
            max_concurrent_activities: 1,
            create_if_missing: true,
            allow_reacquire_after_failure: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionStatus {
    Active,
    Closed,
    /// Its lease or its TTL ran out (`failure_reason` says which).
    Expired,
    /// Its holder deregistered.
    Orphaned,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Closed => "closed",
            SessionStatus::Expired => "expired",
            SessionStatus::Orphaned => "orphaned",
        }
    }
}

/// A session as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerSession {
    pub namespace: String,
    pub options: SessionOptions,
    /// The queue its activities run on (the options' queue, else the holder's task queue).
    pub queue: String,
    pub status: SessionStatus,
    pub failure_reason: Option<String>,
    pub lease_owner: String,
    /// Grows each time the session passes to a holder (created, reacquired).
    pub fence: u64,
    pub lease_expires_at: Millis,
    pub ttl_expires_at: Millis,
    pub closed_at: Option<Millis>,
    /// Why its holder closed it (`worker_shutdown`, …), as the holder said.
    #[serde(default)]
    pub close_reason: Option<String>,
    pub last_heartbeat_at: Millis,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// The worker asking for (or already holding) a session.
#[derive(Clone, Debug)]
pub struct SessionClaimant {
    pub worker_id: String,
    pub task_queue: String,
    /// The capabilities it registered (a session's requirements must be among them).
    pub capabilities: Vec<String>,
    /// How many sessions it may hold at once (`max_concurrent_worker_sessions`).
    pub max_sessions: Option<i64>,
    /// Active sessions it holds now, this one excluded.
    pub sessions_held: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    Created,
    Reused,
    Reacquired,
}

impl AcquireOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AcquireOutcome::Created => "created",
            AcquireOutcome::Reused => "reused",
            AcquireOutcome::Reacquired => "reacquired",
        }
    }
}

impl WorkerSession {
    /// Marks a session whose lease or TTL ran out, or whose holder is gone, for what it is.
    pub fn refresh(&mut self, holder_registered: bool, now: Millis) {
        if matches!(self.status, SessionStatus::Closed) || self.failure_reason.as_deref() == Some("ttl_expired") {
            return;
        }
        if self.ttl_expires_at <= now {
            self.fail(SessionStatus::Expired, "ttl_expired", now);
        } else if self.status == SessionStatus::Active && self.lease_expires_at <= now {
            self.fail(SessionStatus::Expired, "lease_expired", now);
        } else if self.status == SessionStatus::Active && !holder_registered {
            self.fail(SessionStatus::Orphaned, "worker_deregistered", now);
        }
    }

    fn fail(&mut self, status: SessionStatus, reason: &str, now: Millis) {
        self.status = status;
        self.failure_reason = Some(reason.to_string());
        self.updated_at = now;
    }

    /// Whether an activity attempt may run in it now on `worker_id`.
    pub fn held_by(&self, worker_id: &str, now: Millis) -> bool {
        self.status == SessionStatus::Active && self.lease_owner == worker_id && self.lease_expires_at > now && self.ttl_expires_at > now
    }

    fn refused(&self, reason: Reason, message: &str) -> Refusal {
        Refusal::new(reason, message).with("session", self.snapshot())
    }

    /// The session as workers and operators see it.
    pub fn snapshot(&self) -> Value {
        let o = &self.options;
        json!({
            "session_id": o.session_id,
            "namespace": self.namespace,
            "connection": o.connection,
            "queue": self.queue,
            "requirements": o.requirements,
            "status": self.status.as_str(),
            "lease_owner": self.lease_owner,
            "fence": self.fence,
            "lease_expires_at": iso8601(self.lease_expires_at),
            "ttl_expires_at": iso8601(self.ttl_expires_at),
            "closed_at": self.closed_at.map(iso8601),
            "close_reason": self.close_reason,
            "failure_reason": self.failure_reason,
            "lease_seconds": o.lease_seconds,
            "ttl_seconds": o.ttl_seconds,
            "max_concurrent_activities": o.max_concurrent_activities,
            "create_if_missing": o.create_if_missing,
            "allow_reacquire_after_failure": o.allow_reacquire_after_failure,
            "last_heartbeat_at": iso8601(self.last_heartbeat_at),
            "created_at": iso8601(self.created_at),
            "updated_at": iso8601(self.updated_at),
        })
    }

    /// What an activity task of this session carries: the session's options as the workflow
    /// gave them with the session's queue filled in, and its live state.
    pub fn task_view(&self, requested: &Map<String, Value>) -> Value {
        let mut view = requested.clone();
        view.insert("queue".into(), json!(self.queue));
        for (key, value) in [
            ("namespace", json!(self.namespace)),
            ("status", json!(self.status.as_str())),
            ("lease_owner", json!(self.lease_owner)),
            ("lease_expires_at", json!(iso8601(self.lease_expires_at))),
            ("ttl_expires_at", json!(iso8601(self.ttl_expires_at))),
        ] {
            view.insert(key.into(), value);
        }
        Value::Object(view)
    }
}

/// Creates, renews (same holder) or takes over (lapsed, allowed) the session `existing` for
/// `claimant`. `existing` must have been refreshed. `running` is the number of its activity
/// attempts running now, when admitting one more (`None` outside activity admission).
pub fn acquire_session(
    existing: Option<WorkerSession>,
    namespace: &str,
    options: SessionOptions,
    claimant: &SessionClaimant,
    running: Option<i64>,
    now: Millis,
) -> Result<(WorkerSession, AcquireOutcome), Refusal> {
    let queue = options.queue.clone().unwrap_or_else(|| claimant.task_queue.clone());
    if queue != claimant.task_queue {
        return Err(
            Refusal::new(Reason::SessionQueueMismatch, "The session's queue is not the worker's task queue.")
                .with("registered_task_queue", claimant.task_queue.clone())
                .with("requested_session_queue", queue),
        );
    }
    let missing: Vec<&String> = options.requirements.iter().filter(|r| !claimant.capabilities.contains(r)).collect();
    if !missing.is_empty() {
        return Err(Refusal::new(
            Reason::SessionRequirementsNotMet,
            "The worker did not register every capability the session requires.",
        )
        .with("missing_requirements", json!(missing)));
    }
    let within_limit = |held: i64| claimant.max_sessions.is_none_or(|max| held < max);
    match existing {
        None => {
            if !options.create_if_missing {
                return Err(Refusal::new(
                    Reason::SessionMissing,
                    "No such session, and create_if_missing is false.",
                ));
            }
            if !within_limit(claimant.sessions_held) {
                return Err(session_limit(claimant));
            }
            let session = WorkerSession {
                namespace: namespace.to_string(),
                queue,
                status: SessionStatus::Active,
                failure_reason: None,
                lease_owner: claimant.worker_id.clone(),
                fence: 1,
                lease_expires_at: now + options.lease_seconds * 1000,
                ttl_expires_at: now + options.ttl_seconds * 1000,
                closed_at: None,
                close_reason: None,
                last_heartbeat_at: now,
                created_at: now,
                updated_at: now,
                options,
            };
            Ok((session, AcquireOutcome::Created))
        }
        Some(session) if session.status == SessionStatus::Active && session.lease_owner == claimant.worker_id => {
            if running.is_some_and(|n| n >= session.options.max_concurrent_activities) {
                return Err(session
                    .refused(
                        Reason::SessionActivityLimitExceeded,
                        "The session runs as many activities as it may.",
                    )
                    .with("max_concurrent_activities", session.options.max_concurrent_activities));
            }
            Ok((renewed(session, options, now), AcquireOutcome::Reused))
        }
        Some(session) if session.status == SessionStatus::Active => {
            Err(session.refused(Reason::SessionOwnedByAnotherWorker, "Another worker holds the session."))
        }
        Some(session) if session.status == SessionStatus::Closed => Err(session.refused(Reason::SessionClosed, "The session was closed.")),
        Some(session) => {
            let ttl_over = session.failure_reason.as_deref() == Some("ttl_expired");
            if ttl_over || !session.options.allow_reacquire_after_failure || !options.allow_reacquire_after_failure {
                return Err(session.refused(Reason::SessionReacquireDisallowed, "The session cannot be taken over."));
            }
            if !within_limit(claimant.sessions_held) {
                return Err(session_limit(claimant));
            }
            let mut session = renewed(session, options, now);
            session.lease_owner = claimant.worker_id.clone();
            session.fence += 1;
            Ok((session, AcquireOutcome::Reacquired))
        }
    }
}

fn session_limit(claimant: &SessionClaimant) -> Refusal {
    Refusal::new(Reason::WorkerSessionLimitExceeded, "The worker holds as many sessions as it may.")
        .with("max_concurrent_worker_sessions", json!(claimant.max_sessions))
}

/// The holder's renewal: new options and lease, never a new TTL.
fn renewed(mut session: WorkerSession, options: SessionOptions, now: Millis) -> WorkerSession {
    session.lease_expires_at = (now + options.lease_seconds * 1000).min(session.ttl_expires_at);
    session.options = options;
    session.status = SessionStatus::Active;
    session.failure_reason = None;
    session.last_heartbeat_at = now;
    session.updated_at = now;
    session
}

/// The holder renews its lease (`lease_seconds`, else the session's own); the TTL stays.
pub fn heartbeat_session(
    mut session: WorkerSession,
    worker_id: &str,
    lease_seconds: Option<i64>,
    now: Millis,
) -> Result<WorkerSession, Refusal> {
    if session.status != SessionStatus::Active {
        return Err(session.refused(Reason::SessionNotActive, "The session is not active."));
    }
    if session.lease_owner != worker_id {
        return Err(session.refused(Reason::SessionOwnerMismatch, "Another worker holds the session."));
    }
    let lease = lease_seconds.unwrap_or(session.options.lease_seconds);
    session.lease_expires_at = (now + lease * 1000).min(session.ttl_expires_at);
    session.last_heartbeat_at = now;
    session.updated_at = now;
    Ok(session)
}

/// The holder closes the session, saying why; closing it again is answered `already_closed`.
pub fn close_session(
    mut session: WorkerSession,
    worker_id: &str,
    reason: Option<String>,
    now: Millis,
) -> Result<(WorkerSession, &'static str), Refusal> {
    if session.lease_owner != worker_id {
        return Err(session.refused(Reason::SessionOwnerMismatch, "Another worker holds the session."));
    }
    if session.status == SessionStatus::Closed {
        return Ok((session, "already_closed"));
    }
    session.status = SessionStatus::Closed;
    session.closed_at = Some(now);
    session.close_reason = reason;
    session.updated_at = now;
    Ok((session, "closed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_000_000;

    fn claimant(worker: &str) -> SessionClaimant {
        SessionClaimant {
            worker_id: worker.into(),
            task_queue: "q".into(),
            capabilities: vec!["gpu".into()],
            max_sessions: Some(2),
            sessions_held: 0,
        }
    }

    fn created(worker: &str) -> WorkerSession {
        let (session, outcome) = acquire_session(None, "ns", SessionOptions::new("s"), &claimant(worker), None, NOW).unwrap();
        assert_eq!(outcome, AcquireOutcome::Created);
        session
    }

    #[test]
    fn a_session_is_created_renewed_by_its_holder_and_refused_to_others() {
        let session = created("a");
        assert_eq!((session.fence, session.queue.as_str()), (1, "q"));
        assert_eq!(session.lease_expires_at, NOW + 120_000);
        assert_eq!(session.ttl_expires_at, NOW + 1_800_000);
        let (reused, outcome) =
            acquire_session(Some(session.clone()), "ns", SessionOptions::new("s"), &claimant("a"), None, NOW + 5).unwrap();
        assert_eq!((outcome, reused.fence), (AcquireOutcome::Reused, 1));
        let refused = acquire_session(Some(session.clone()), "ns", SessionOptions::new("s"), &claimant("b"), None, NOW).unwrap_err();
        assert_eq!(refused.reason, Reason::SessionOwnedByAnotherWorker);
        let renewed = heartbeat_session(session.clone(), "a", Some(10), NOW + 1000).unwrap();
        assert_eq!(renewed.lease_expires_at, NOW + 11_000);
        assert_eq!(renewed.ttl_expires_at, session.ttl_expires_at, "the TTL never moves");
        assert_eq!(
            heartbeat_session(session, "b", None, NOW).unwrap_err().reason,
            Reason::SessionOwnerMismatch
        );
    }

    #[test]
    fn a_lapsed_session_is_taken_over_with_a_higher_fence_unless_forbidden() {
        let mut session = created("a");
        session.refresh(true, NOW + 120_000);
        assert_eq!(
            (session.status, session.failure_reason.as_deref()),
            (SessionStatus::Expired, Some("lease_expired"))
        );
        let (taken, outcome) = acquire_session(
            Some(session.clone()),
            "ns",
            SessionOptions::new("s"),
            &claimant("b"),
            None,
            NOW + 120_001,
        )
        .unwrap();
        assert_eq!(
            (outcome, taken.lease_owner.as_str(), taken.fence),
            (AcquireOutcome::Reacquired, "b", 2)
        );
        assert_eq!(taken.ttl_expires_at, session.ttl_expires_at);
        assert_eq!(
            heartbeat_session(taken, "a", None, NOW + 120_002).unwrap_err().reason,
            Reason::SessionOwnerMismatch,
            "the former holder is fenced off"
        );
        let forbidding = SessionOptions {
            allow_reacquire_after_failure: false,
            ..SessionOptions::new("s")
        };
        let refused = acquire_session(Some(session.clone()), "ns", forbidding, &claimant("b"), None, NOW + 120_001).unwrap_err();
        assert_eq!(refused.reason, Reason::SessionReacquireDisallowed);
        let mut gone = created("a");
        gone.refresh(false, NOW + 1);
        assert_eq!(gone.status, SessionStatus::Orphaned, "a deregistered holder loses its session");
    }

    #[test]
    fn ttl_expiry_and_close_end_a_session_for_good() {
        let mut session = created("a");
        session.refresh(true, NOW + 1_800_000);
        assert_eq!(session.failure_reason.as_deref(), Some("ttl_expired"));
        let refused = acquire_session(Some(session), "ns", SessionOptions::new("s"), &claimant("a"), None, NOW + 1_800_001).unwrap_err();
        assert_eq!(refused.reason, Reason::SessionReacquireDisallowed);
        let (closed, outcome) = close_session(created("a"), "a", Some("worker_shutdown".into()), NOW + 1).unwrap();
        assert_eq!((outcome, closed.status), ("closed", SessionStatus::Closed));
        assert_eq!(closed.snapshot()["close_reason"], "worker_shutdown", "the holder's reason is kept");
        assert_eq!(close_session(closed.clone(), "a", None, NOW + 2).unwrap().1, "already_closed");
        let refused = acquire_session(Some(closed), "ns", SessionOptions::new("s"), &claimant("a"), None, NOW + 3).unwrap_err();
        assert_eq!(refused.reason, Reason::SessionClosed);
    }

    #[test]
    fn admission_checks_requirements_queue_limits_and_concurrency() {
        let needs = |requirement: &str| SessionOptions {
            requirements: vec![requirement.into()],
            ..SessionOptions::new("s")
        };
        assert!(acquire_session(None, "ns", needs("gpu"), &claimant("a"), None, NOW).is_ok());
        let refused = acquire_session(None, "ns", needs("tpu"), &claimant("a"), None, NOW).unwrap_err();
        assert_eq!(refused.reason, Reason::SessionRequirementsNotMet);
        let elsewhere = SessionOptions {
            queue: Some("other".into()),
            ..SessionOptions::new("s")
        };
        assert_eq!(
            acquire_session(None, "ns", elsewhere, &claimant("a"), None, NOW)
                .unwrap_err()
                .reason,
            Reason::SessionQueueMismatch
        );
        let full = SessionClaimant {
            sessions_held: 2,
            ..claimant("a")
        };
        assert_eq!(
            acquire_session(None, "ns", SessionOptions::new("s"), &full, None, NOW)
                .unwrap_err()
                .reason,
            Reason::WorkerSessionLimitExceeded
        );
        let busy = acquire_session(Some(created("a")), "ns", SessionOptions::new("s"), &claimant("a"), Some(1), NOW).unwrap_err();
        assert_eq!(busy.reason, Reason::SessionActivityLimitExceeded);
        let missing = SessionOptions {
            create_if_missing: false,
            ..SessionOptions::new("s")
        };
        assert_eq!(
            acquire_session(None, "ns", missing, &claimant("a"), None, NOW).unwrap_err().reason,
            Reason::SessionMissing
        );
    }
}
