//! Query tasks: a client's question routed to a live worker, which replays the committed history
//! and answers. Queries never write history; a query task is single-use and fenced like any lease
//! (`query_task_attempt` grows each time it is leased).

use crate::payload::Payload;
use crate::refusal::{Reason, Refusal};
use crate::Millis;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum QueryState {
    Ready,
    Leased { owner: String, expires_at: Millis },
    Answered(QueryOutcome),
}

/// What a worker is asked: a query, or whether an update passes its validator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryKind {
    #[default]
    Query,
    UpdateValidation,
}

impl QueryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            QueryKind::Query => "query",
            QueryKind::UpdateValidation => "update_validation",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum QueryOutcome {
    Result(Payload),
    /// The update's validator approved it.
    Approved,
    /// The update's validator refused it.
    Rejected {
        message: String,
        failure_type: Option<String>,
        validation_errors: Option<serde_json::Value>,
    },
    /// The worker could not answer; `reason` is its DW reason (`rejected_unknown_query`, …).
    Failed {
        reason: Option<String>,
        message: String,
        failure_type: Option<String>,
        /// The worker's stack trace, returned to the caller with the refusal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stack_trace: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryTask {
    pub id: String,
    #[serde(default)]
    pub kind: QueryKind,
    pub namespace: String,
    pub task_queue: String,
    pub workflow_id: String,
    pub run_id: String,
    pub workflow_type: String,
    /// The query's name, or the update's for a validation.
    pub query_name: String,
    pub arguments: Option<Payload>,
    pub state: QueryState,
    /// Leases granted so far: the `query_task_attempt` fence of the current lease.
    pub attempt: u32,
    pub created_at: Millis,
    /// After this the asking client has given up; the task can no longer be leased.
    pub deadline_at: Millis,
}

impl QueryTask {
    pub fn is_answered(&self) -> bool {
        matches!(self.state, QueryState::Answered(_))
    }

    /// Whether a poller may lease it now: ready, or its lease ran out unanswered.
    pub fn leasable(&self, now: Millis) -> bool {
        now < self.deadline_at
            && match &self.state {
                QueryState::Ready => true,
                QueryState::Leased { expires_at, .. } => *expires_at <= now,
                QueryState::Answered(_) => false,
            }
    }

    pub fn lease(&mut self, owner: &str, lease_ms: i64, now: Millis) -> Result<(), Refusal> {
        if !self.leasable(now) {
            return Err(Refusal::new(Reason::QueryTaskNotLeased, "The query task cannot be leased."));
        }
        self.attempt += 1;
        self.state = QueryState::Leased {
            owner: owner.to_string(),
            expires_at: (now + lease_ms).min(self.deadline_at),
        };
        Ok(())
    }

    /// Whether `(owner, attempt)` holds the live lease now (the query-task authority a worker
    /// checks while it replays); the refusal says why not. Never renews anything.
    pub fn check_authority(&self, owner: &str, attempt: u32, now: Millis) -> Result<Millis, Refusal> {
        let refusal = |reason, message: &str| {
            Refusal::new(reason, message)
                .with("query_task_id", self.id.clone())
                .with("query_task_attempt", attempt)
        };
        match &self.state {
            QueryState::Leased { owner: holder, .. } if holder != owner => {
                Err(refusal(Reason::LeaseOwnerMismatch, "The query task is leased to another worker."))
            }
            QueryState::Leased { .. } if attempt != self.attempt => Err(refusal(
                Reason::QueryTaskAttemptMismatch,
                "The query task attempt does not match its lease.",
            )),
            QueryState::Leased { expires_at, .. } if *expires_at <= now || self.deadline_at <= now => {
                Err(refusal(Reason::LeaseExpired, "The query task lease has expired."))
            }
            QueryState::Leased { expires_at, .. } => Ok(*expires_at),
            QueryState::Ready => Err(refusal(Reason::QueryTaskNotLeased, "The query task is not leased.")),
            QueryState::Answered(_) => Err(refusal(Reason::QueryTaskNotLeased, "The query task was already answered.")),
        }
    }

    /// Records the worker's answer, if `(owner, attempt)` holds the live lease. A query takes a
    /// result or a failure, a validation a verdict or a failure: an answer of the other kind is
    /// addressed to a task that does not exist.
    pub fn answer(&mut self, owner: &str, attempt: u32, outcome: QueryOutcome, now: Millis) -> Result<(), Refusal> {
        let refusal = |reason, message: &str| {
            Refusal::new(reason, message)
                .with("query_task_id", self.id.clone())
                .with("query_task_attempt", attempt)
        };
        let fits = match outcome {
            QueryOutcome::Failed { .. } => true,
            QueryOutcome::Result(_) => self.kind == QueryKind::Query,
            QueryOutcome::Approved | QueryOutcome::Rejected { .. } => self.kind == QueryKind::UpdateValidation,
        };
        if !fits {
            return Err(refusal(Reason::QueryTaskNotFound, "No task of this kind has that id."));
        }
        match &self.state {
            QueryState::Leased { owner: holder, expires_at } => {
                if holder != owner {
                    return Err(refusal(Reason::LeaseOwnerMismatch, "The query task is leased to another worker.")
                        .with("lease_owner", holder.clone()));
                }
                if attempt != self.attempt {
                    return Err(
                        refusal(Reason::QueryTaskAttemptMismatch, "The query task attempt does not match its lease.")
                            .with("current_attempt", self.attempt),
                    );
                }
                if *expires_at <= now {
                    return Err(refusal(Reason::LeaseExpired, "The query task lease has expired."));
                }
            }
            QueryState::Ready => return Err(refusal(Reason::QueryTaskNotLeased, "The query task is not leased.")),
            QueryState::Answered(_) => return Err(refusal(Reason::QueryTaskNotLeased, "The query task was already answered.")),
        }
        self.state = QueryState::Answered(outcome);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> QueryTask {
        QueryTask {
            id: "q1".into(),
            kind: QueryKind::Query,
            namespace: "default".into(),
            task_queue: "q".into(),
            workflow_id: "wf".into(),
            run_id: "run".into(),
            workflow_type: "t".into(),
            query_name: "status".into(),
            arguments: None,
            state: QueryState::Ready,
            attempt: 0,
            created_at: 0,
            deadline_at: 30_000,
        }
    }

    fn answer() -> QueryOutcome {
        QueryOutcome::Result(Payload::avro("x"))
    }

    #[test]
    fn only_the_live_lease_may_answer_once() {
        let mut q = task();
        q.lease("a", 5_000, 0).unwrap();
        assert_eq!(q.attempt, 1);
        assert!(q.lease("b", 5_000, 1_000).is_err(), "a live lease is exclusive");
        assert_eq!(
            q.clone().answer("b", 1, answer(), 1_000).unwrap_err().reason,
            Reason::LeaseOwnerMismatch
        );
        assert_eq!(
            q.clone().answer("a", 2, answer(), 1_000).unwrap_err().reason,
            Reason::QueryTaskAttemptMismatch
        );
        // The lease runs out: another worker gets attempt 2 and the first one's answer is stale.
        q.lease("b", 5_000, 6_000).unwrap();
        assert_eq!(q.attempt, 2);
        assert_eq!(
            q.clone().answer("a", 1, answer(), 6_500).unwrap_err().reason,
            Reason::LeaseOwnerMismatch
        );
        q.answer("b", 2, answer(), 6_500).unwrap();
        assert_eq!(
            q.clone().answer("b", 2, answer(), 6_600).unwrap_err().reason,
            Reason::QueryTaskNotLeased
        );
        assert!(!q.leasable(7_000));
    }

    #[test]
    fn authority_holds_only_for_the_live_lease_and_renews_nothing() {
        let mut q = task();
        assert_eq!(q.check_authority("a", 1, 0).unwrap_err().reason, Reason::QueryTaskNotLeased);
        q.lease("a", 5_000, 0).unwrap();
        assert_eq!(q.check_authority("a", 1, 1_000), Ok(5_000));
        assert_eq!(q.check_authority("b", 1, 1_000).unwrap_err().reason, Reason::LeaseOwnerMismatch);
        assert_eq!(
            q.check_authority("a", 2, 1_000).unwrap_err().reason,
            Reason::QueryTaskAttemptMismatch
        );
        assert_eq!(q.check_authority("a", 1, 5_000).unwrap_err().reason, Reason::LeaseExpired);
        q.lease("b", 5_000, 6_000).unwrap();
        assert_eq!(q.check_authority("a", 1, 6_001).unwrap_err().reason, Reason::LeaseOwnerMismatch);
        q.answer("b", 2, answer(), 6_500).unwrap();
        assert_eq!(q.check_authority("b", 2, 6_600).unwrap_err().reason, Reason::QueryTaskNotLeased);
    }

    #[test]
    fn answers_must_fit_the_kind_of_task() {
        let mut q = task();
        q.lease("a", 5_000, 0).unwrap();
        assert_eq!(
            q.clone().answer("a", 1, QueryOutcome::Approved, 1).unwrap_err().reason,
            Reason::QueryTaskNotFound
        );
        let mut v = QueryTask {
            kind: QueryKind::UpdateValidation,
            ..task()
        };
        v.lease("a", 5_000, 0).unwrap();
        assert_eq!(v.clone().answer("a", 1, answer(), 1).unwrap_err().reason, Reason::QueryTaskNotFound);
        v.answer("a", 1, QueryOutcome::Approved, 1).unwrap();
    }

    #[test]
    fn nothing_is_leased_after_the_client_gave_up() {
        let mut q = task();
        assert_eq!(q.lease("a", 5_000, 30_000).unwrap_err().reason, Reason::QueryTaskNotLeased);
        q.lease("a", 60_000, 29_000).unwrap();
        assert!(
            matches!(q.state, QueryState::Leased { expires_at: 30_000, .. }),
            "a lease never outlives the query"
        );
    }
}
