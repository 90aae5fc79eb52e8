//! A worker's poll: the request every poll route reads ([`PollRequest`]), and the long-poll
//! wait (look for work, and wait for a wake-up or the re-check between looks).

use crate::error::ApiResult;
use crate::wire::Fields;
use crate::AppState;
use capstan_app::polls;
use capstan_engine::{RunState, Task};
use capstan_store::{HandedOff, Parked, Store, WorkerRecord};
use serde_json::{Map, Value};
use std::time::Duration;

/// What a poll asks for: the registered worker polling, its queue, a retry key, how long it
/// waits and how much history it takes with a workflow task.
pub(crate) struct PollRequest {
    pub(crate) worker: WorkerRecord,
    pub(crate) queue: String,
    pub(crate) poll_request_id: Option<String>,
    pub(crate) wait_ms: i64,
    pub(crate) history_page_size: usize,
}

pub(crate) async fn poll_request<S: Store>(state: &AppState<S>, namespace: &str, body: &Map<String, Value>) -> ApiResult<PollRequest> {
    let f = Fields::new(body);
    let worker_id = f.req_str("worker_id", 255)?;
    let queue = f.req_str("task_queue", 255)?;
    let poll_request_id = f.opt_str("poll_request_id", 255)?;
    let wait_ms = (f.opt_int("timeout_seconds", 0, 3600)?.unwrap_or(30).min(60) * 1000).min(state.config.poll_wait_max_ms);
    let history_page_size = f.opt_int("history_page_size", 1, 1000)?.unwrap_or(500) as usize;
    let build_id = f.opt_str("build_id", 255)?;
    let worker = polls::poller(state, namespace, &worker_id, &queue, build_id.as_deref()).await?;
    Ok(PollRequest {
        worker,
        queue,
        poll_request_id,
        wait_ms,
        history_page_size,
    })
}

/// One look of a long poll.
pub(crate) enum Look<T> {
    Found(T),
    /// Work is (or may be) ready on the queue that this look did not take.
    Missed,
    /// Nothing is ready on the queue.
    Idle,
    /// The queue's flow-control limits hold claims back for this many milliseconds.
    Throttled(i64),
    /// The poll ends now without work (its worker registered again, differently).
    Ended,
}

impl From<polls::Claim> for Look<(Task, RunState)> {
    fn from(claim: polls::Claim) -> Self {
        match claim {
            polls::Claim::Leased(leased) => Look::Found(*leased),
            polls::Claim::Missed => Look::Missed,
            polls::Claim::Idle => Look::Idle,
            polls::Claim::Throttled { retry_after_ms, .. } => Look::Throttled(retry_after_ms),
            polls::Claim::Reregistered => Look::Ended,
        }
    }
}

/// How a long poll parks between looks (`capstan_app::polls::park`): a transaction that makes a
/// task it may take ready leases the task to it and answers it after COMMIT, and what that
/// lease is to the caller.
pub(crate) struct Parking<'a, T> {
    pub(crate) park: &'a (dyn Fn() -> Parked + Send + Sync),
    pub(crate) found: fn(HandedOff) -> T,
}

/// What ended a wait between looks.
enum Waited<T> {
    Handed(T),
    Woken,
    /// The re-check came due, or a transaction that took the parked poll rolled back.
    LookAgain,
}

/// The long-poll loop: look, and until `wait_ms` is spent, look again whenever the queue is
/// woken (or at least every second, which also finds tasks whose backoff ran out). Between
/// looks the poll is parked (`parking`), so a task made ready meanwhile on this node is handed
/// to it in the transaction that makes it.
///
/// An announcement of new work wakes one waiting poller, not all of them (a herd racing for one
/// task cost a claim transaction per poller, all but one in vain). So the wake-up must not die
/// with a poller that cannot use it: one that takes work hands it on (more may be ready, and one
/// announcement may stand for several tasks); one that finds work it cannot take hands it on
/// once per poll, which walks it through the waiting pollers to one that can; one that finds the
/// queue empty keeps it. A wake-up that still goes astray costs the one-second re-check.
pub(crate) async fn wait_for_work<T, F, Fut>(
    notify: &tokio::sync::Notify,
    wait_ms: i64,
    parking: Option<Parking<'_, T>>,
    mut look: F,
) -> ApiResult<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ApiResult<Look<T>>>,
{
    // A transport wait, not a domain time: measured on the monotonic clock.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms.max(0) as u64);
    let (mut by_announcement, mut handed_on) = (false, false);
    loop {
        // Subscribe before looking, so a wake-up between the look and the wait is not lost.
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        match look().await? {
            Look::Found(found) => {
                if by_announcement {
                    notify.notify_one();
                }
                return Ok(Some(found));
            }
            Look::Missed if by_announcement && !handed_on => {
                notify.notify_one();
                handed_on = true;
            }
            Look::Throttled(retry_after_ms) => {
                // New work does not lift a limit: look again when it may let a claim through.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                tokio::time::sleep(left.min(Duration::from_millis(retry_after_ms.max(1) as u64))).await;
                by_announcement = false;
                continue;
            }
            Look::Ended => return Ok(None),
            Look::Missed | Look::Idle => {}
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let recheck = left.clamp(Duration::from_millis(1), Duration::from_secs(1));
        let mut parked = parking.as_ref().map(|parking| (parking.park)());
        let handed = async {
            match parked.as_mut() {
                Some(parked) => parked.handed().await,
                None => std::future::pending().await,
            }
        };
        let waited = tokio::select! {
            handed = handed => match handed {
                Some(handed) => Waited::Handed(handed),
                None => Waited::LookAgain,
            },
            _ = &mut woken => Waited::Woken,
            _ = tokio::time::sleep(recheck) => Waited::LookAgain,
        };
        // Leaving the registry: a transaction that took the poll meanwhile decides the outcome.
        let waited = match (waited, parked) {
            (Waited::Handed(handed), _) => Waited::Handed(handed),
            (other, Some(parked)) => parked.leave().await.map_or(other, Waited::Handed),
            (other, None) => other,
        };
        by_announcement = match waited {
            Waited::Handed(handed) => {
                let found = parking.as_ref().map(|parking| (parking.found)(handed));
                return Ok(found);
            }
            Waited::Woken => true,
            Waited::LookAgain => false,
        };
    }
}

/// Gives back, as they come, the leases handed to parked polls that went away before their
/// answer (`capstan_app::polls::give_back`), so a vanished poller holds no workflow task for a
/// whole lease.
pub(crate) async fn give_back_undelivered<S: Store>(state: std::sync::Arc<AppState<S>>) {
    loop {
        for handed in state.store.undelivered_hand_offs().await {
            match polls::give_back(&*state, handed).await {
                Ok(Some(run)) => state.run_changed(&run),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "a lease handed to a poll that went away could not be given back"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Pollers on a plain `Notify`, in paused time: a look that needed the one-second re-check
    //! shows as a second of time passed.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::sync::Notify;
    use tokio::time::Instant;

    /// A queue as the pollers see it: ready tasks and every look counted.
    #[derive(Default)]
    struct Queue {
        ready: AtomicUsize,
        looks: AtomicUsize,
    }

    impl Queue {
        /// A poller that can take the queue's tasks.
        fn take(&self) -> Look<()> {
            self.looks.fetch_add(1, Ordering::SeqCst);
            let taken = self.ready.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if taken.is_ok() {
                Look::Found(())
            } else {
                Look::Idle
            }
        }

        /// A poller that cannot (another type, build or sticky worker).
        fn cannot_take(&self) -> Look<()> {
            self.looks.fetch_add(1, Ordering::SeqCst);
            if self.ready.load(Ordering::SeqCst) > 0 {
                Look::Missed
            } else {
                Look::Idle
            }
        }
    }

    fn poller(notify: &Arc<Notify>, queue: &Arc<Queue>, can_take: bool) -> tokio::task::JoinHandle<Option<Duration>> {
        let (notify, queue) = (notify.clone(), queue.clone());
        tokio::spawn(async move {
            let began = Instant::now();
            let look = || {
                let queue = queue.clone();
                async move { Ok(if can_take { queue.take() } else { queue.cannot_take() }) }
            };
            let found = wait_for_work(&notify, 60_000, None, look).await.unwrap();
            found.map(|()| began.elapsed())
        })
    }

    /// Lets every spawned poller run until it waits, without letting paused time move on.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_announcement_wakes_one_poller_not_the_herd() {
        let (notify, queue) = (Arc::new(Notify::new()), Arc::new(Queue::default()));
        let pollers: Vec<_> = (0..8).map(|_| poller(&notify, &queue, true)).collect();
        settle().await;
        assert_eq!(queue.looks.load(Ordering::SeqCst), 8, "each looked once on arrival");
        queue.ready.store(1, Ordering::SeqCst);
        notify.notify_one();
        settle().await;
        // The taker looked, and handed on to one more, which found the queue empty and kept it.
        assert_eq!(queue.looks.load(Ordering::SeqCst), 8 + 2);
        let finished = pollers.iter().filter(|p| p.is_finished()).count();
        assert_eq!(finished, 1);
        pollers.into_iter().for_each(|p| p.abort());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_walks_on_to_a_poller_that_can_take_the_work() {
        let (notify, queue) = (Arc::new(Notify::new()), Arc::new(Queue::default()));
        // The longest waiting, and so the first woken, cannot take the work.
        let others: Vec<_> = (0..3).map(|_| poller(&notify, &queue, false)).collect();
        settle().await;
        let taker = poller(&notify, &queue, true);
        settle().await;
        queue.ready.store(1, Ordering::SeqCst);
        notify.notify_one();
        let waited = taker.await.unwrap().expect("the work reached the poller that can take it");
        assert!(waited < Duration::from_secs(1), "without waiting for the re-check ({waited:?})");
        others.into_iter().for_each(|p| p.abort());
    }

    #[tokio::test(start_paused = true)]
    async fn one_announcement_for_several_tasks_reaches_as_many_pollers() {
        let (notify, queue) = (Arc::new(Notify::new()), Arc::new(Queue::default()));
        let pollers: Vec<_> = (0..4).map(|_| poller(&notify, &queue, true)).collect();
        settle().await;
        queue.ready.store(4, Ordering::SeqCst);
        notify.notify_one();
        for poller in pollers {
            let waited = poller.await.unwrap().expect("a task for every poller");
            assert!(waited < Duration::from_secs(1), "handed on, not re-checked ({waited:?})");
        }
    }
}
