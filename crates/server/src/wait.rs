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
use capstan_engine::Millis;
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
    /// How long is left at `now` of the server's clock, `None` once the wait has run out.
    fn left(&self, now: Millis) -> Option<Duration> {
        match *self {
            Until::Clock(deadline) => {
                let left = deadline - now;
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
/// `now` reads the server's clock.
pub(crate) async fn settle<T, F, Fut>(
    now: impl Fn() -> Millis,
    until: Until,
    recheck: Duration,
    wake: Option<&Notify>,
    mut look: F,
) -> ApiResult<Result<T, T>>
where
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
        let Some(left) = until.left(now()) else { return Ok(Err(pending)) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::sync::Arc;

    const HOUR: Duration = Duration::from_secs(3600);

    fn far() -> Until {
        Until::Elapsed(tokio::time::Instant::now() + 2 * HOUR)
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_look_ends_the_wait_at_once() {
        let looked = settle(|| 0, far(), HOUR, None, || async { Ok(Look::Settled(7)) }).await.unwrap();
        assert_eq!(looked, Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_cuts_the_sleep_short() {
        let notify = Arc::new(Notify::new());
        let waker = notify.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waker.notify_waiters();
        });
        let looks = AtomicUsize::new(0);
        let started = tokio::time::Instant::now();
        let looked = settle(
            || 0,
            far(),
            HOUR,
            Some(&notify),
            || async {
                Ok(match looks.fetch_add(1, Ordering::SeqCst) {
                    0 => Look::Pending(0),
                    n => Look::Settled(n),
                })
            },
        )
        .await
        .unwrap();
        assert_eq!(looked, Ok(1));
        assert!(started.elapsed() < Duration::from_secs(1), "woken, not rechecked an hour later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_between_the_look_and_the_sleep_is_not_missed() {
        let notify = Notify::new();
        let looks = AtomicUsize::new(0);
        let started = tokio::time::Instant::now();
        let looked = settle(
            || 0,
            far(),
            HOUR,
            Some(&notify),
            || async {
                Ok(match looks.fetch_add(1, Ordering::SeqCst) {
                    // The change commits after this look read, before the wait sleeps.
                    0 => {
                        notify.notify_waiters();
                        Look::Pending(0)
                    }
                    n => Look::Settled(n),
                })
            },
        )
        .await
        .unwrap();
        assert_eq!(looked, Ok(1));
        assert!(started.elapsed() < Duration::from_secs(1), "the armed notifier caught it");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_wake_it_looks_again_each_recheck_until_the_clock_runs_out() {
        // The server's clock moves 100 ms per look; the deadline is 1 s ahead.
        let clock = AtomicI64::new(0);
        let looks = AtomicUsize::new(0);
        let looked = settle(
            || clock.load(Ordering::SeqCst),
            Until::Clock(1_000),
            Duration::from_millis(5),
            None,
            || async {
                clock.fetch_add(100, Ordering::SeqCst);
                Ok(Look::Pending(looks.fetch_add(1, Ordering::SeqCst) + 1))
            },
        )
        .await
        .unwrap();
        assert_eq!(looked, Err(10), "the last look's value answers a wait that ran out");
    }

    #[tokio::test(start_paused = true)]
    async fn an_elapsed_wait_sleeps_no_longer_than_what_is_left() {
        let started = tokio::time::Instant::now();
        let until = Until::Elapsed(started + Duration::from_millis(30));
        let looked = settle(|| 0, until, HOUR, None, || async { Ok(Look::Pending(())) }).await.unwrap();
        assert_eq!(looked, Err(()));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(30) && waited < Duration::from_secs(1), "{waited:?}");
    }
}
