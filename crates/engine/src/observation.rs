//! What a transition did that operators count but history does not show as such: a lease that
//! ran out, an activity attempt's timeout, a timer that fired. Pure data in `Effects`; the store
//! hands it to its observer (the server's metrics) only once the transaction is durable, so a
//! refused or rolled-back transition is never counted.

use crate::TaskKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The clock took a leased task back before its worker reported: a workflow task's lease ran
    /// out (the task is offered again), or a leased activity attempt ran out of its lease or of
    /// a timeout budget (the attempt ends, then is retried or fails).
    LeaseExpired { kind: TaskKind },
    /// An activity attempt or execution ran out of a budget: `schedule_to_start`,
    /// `start_to_close`, `heartbeat`, `schedule_to_close` or `lease_expired`.
    ActivityTimedOut { timeout_kind: &'static str },
    /// A durable timer fired.
    TimerFired,
    /// The run's history crossed a budget threshold: `approaching` or
    /// `continue_as_new_recommended` (`crate::history_budget`).
    HistoryBudgetCrossed { pressure: &'static str },
}
