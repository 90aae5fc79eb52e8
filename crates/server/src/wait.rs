//! Waiting for a change a request asked to see: an update's outcome, a new history event, a
//! worker's answer to a query or a validation, a stream's next items. One loop for all of them
//! ([`settle`]) and their bounds in one table; the long poll for tasks is `long_poll.rs`.
//!
//! A wait looks, and until the look settles or the wait runs out, sleeps until the change's
//! notifier fires (when it has one: answers and stream appends on this node) or the re-check
//! interval passes (changes committed by another node, or with no notifier), then looks again.
//! The notifier is armed before each look, so a change between the look and the sleep is not
//! missed.

use crate::error::ApiResult;
use crate::AppState;
use capstan_engine::Millis;
use capstan_store::Store;
use capstan_sync::shim::Notify;
use std::future::Future;
use std::time::Duration;

/// The default and longest wait for an update's `completed` outcome (DW's bounds).
pub(crate) const UPDATE_WAIT_DEFAULT_SECONDS: i64 = 30;
pub(crate) const UPDATE_WAIT_MAX_SECONDS: i64 = 300;
/// An update's outcome is re-read this often (no notifier: it is written by a workflow task).
pub(crate) const UPDATE_RECHECK: Duration = Duration::from_millis(25);
/// A history read with `wait_new_event` waits this long for an event after its page.
pub(crate) const HISTORY_WAIT_MS: Millis = 30_000;
pub(crate) const HISTORY_RECHECK: Duration = Duration::from_millis(250);
/// A worker's answer to a query or a validation committed by another node is noticed this
/// often (this node's answers wake the wait at once).
pub(crate) const ANSWER_RECHECK: Duration = Duration::from_millis(50);
/// A stream read waiting for items re-reads this often (another node's appends; DW's cadence).
pub(crate) const STREAM_RECHECK: Duration = Duration::from_millis(250);

/// What one look saw.
pub(crate) enum Look<T> {
    /// What the wait was for: it ends.
    Settled(T),
    /// Not yet; if the wait has run out, this is its answer.
    Pending(T),
}

/// When a wait runs out.
#[derive(Clone, Copy)]
pub(crate) enum Until {
    /// At this instant of the server's clock (a deadline the request or a task states).
    Clock(Millis),
    /// After this much real time (a wait the client asked for in seconds).
    Elapsed(tokio::time::Instant),
}

impl Until {
    /// How long is left, `None` once the wait has run out.
    fn left<S: Store>(&self, state: &AppState<S>) -> Option<Duration> {
        match *self {
            Until::Clock(deadline) => {
                let left = deadline - state.now();
                (left > 0).then(|| Duration::from_millis(left as u64))
            }
            Until::Elapsed(deadline) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                (!left.is_zero()).then_some(left)
            }
        }
    }
}

/// Looks with `look` until it settles (`Ok(value)`) or the wait runs out (`Err(last value)`),
/// sleeping between looks until `wake` fires or `recheck` (at most what is left) passes.
pub(crate) async fn settle<S, T, F, Fut>(
    state: &AppState<S>,
    until: Until,
    recheck: Duration,
    wake: Option<&Notify>,
    mut look: F,
) -> ApiResult<Result<T, T>>
where
    S: Store,
    F: FnMut() -> Fut,
    Fut: Future<Output = ApiResult<Look<T>>>,
{
    loop {
        let woken = wake.map(|notify| notify.notified());
        tokio::pin!(woken);
        if let Some(woken) = woken.as_mut().as_pin_mut() {
            woken.enable();
        }
        let pending = match look().await? {
            Look::Settled(value) => return Ok(Ok(value)),
            Look::Pending(value) => value,
        };
        let Some(left) = until.left(state) else { return Ok(Err(pending)) };
        let nap = tokio::time::sleep(recheck.min(left));
        match woken.as_mut().as_pin_mut() {
            Some(woken) => {
                tokio::select! {
                    _ = woken => {}
                    _ = nap => {}
                }
            }
            None => nap.await,
        }
    }
}
