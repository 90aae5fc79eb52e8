//! Polls parked on this node, waiting for work. A transaction that makes a task ready leases it
//! to a parked poll that may take it (`logic/handoff.rs`) and the poll is answered once that
//! transaction commits: no claim transaction, no second write of the run (Temporal calls it a
//! sync match).
//!
//! A parked poll is a one-shot channel. A transaction takes it out of the registry (so no other
//! transaction can), and its answer is sent only after COMMIT; a transaction that rolls back
//! drops it unanswered, and the poll looks again. Only polls whose receiver is still there are
//! taken (a client that went away dropped it), and an answer whose receiver went in the few
//! milliseconds between the take and the commit is kept as undelivered, for the node to give
//! the task back (`capstan_app::polls::give_back`).

use crate::PollKey;
use capstan_engine::{RunState, Task, TaskKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, Notify};

/// Who is parked: the poll's worker, what it runs and the lease it takes.
#[derive(Clone, Debug)]
pub struct Poller {
    pub namespace: String,
    pub kind: TaskKind,
    pub queue: String,
    pub worker_id: String,
    /// The worker's registered build (a task pinned to another build is not for it).
    pub build_id: Option<String>,
    /// The types it runs (any when empty).
    pub types: Vec<String>,
    pub lease_ms: i64,
    /// The poll's request id, remembered with the lease (a retried poll gets it back).
    pub poll: Option<PollKey>,
}

impl Poller {
    /// Whether it runs `type_name`.
    pub fn runs(&self, type_name: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|t| t == type_name)
    }
}

/// A task leased to a parked poll, with its run as the lease left it.
#[derive(Clone, Debug)]
pub struct HandedOff {
    pub task: Task,
    pub run: RunState,
}

type QueueKey = (String, TaskKind, String);

struct Waiting {
    id: u64,
    poller: Arc<Poller>,
    answer: oneshot::Sender<HandedOff>,
}

/// The node's parked polls, by queue, oldest first.
#[derive(Default)]
pub struct ParkedPolls {
    waiting: Mutex<HashMap<QueueKey, Vec<Waiting>>>,
    /// How many are parked, read without the lock by every transaction that makes a task ready.
    count: AtomicUsize,
    next_id: AtomicU64,
    undelivered: Mutex<Vec<HandedOff>>,
    undelivered_added: Notify,
}

impl std::fmt::Debug for ParkedPolls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedPolls").field("count", &self.parked()).finish()
    }
}

impl ParkedPolls {
    /// Parks a poll: a transaction that makes a task `poller` may take ready hands it over.
    pub fn park(self: &Arc<Self>, poller: Poller) -> Parked {
        let (answer, receiver) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let key = (poller.namespace.clone(), poller.kind, poller.queue.clone());
        let mut waiting = self.waiting.lock().expect("parked polls");
        waiting.entry(key.clone()).or_default().push(Waiting {
            id,
            poller: Arc::new(poller),
            answer,
        });
        self.count.fetch_add(1, Ordering::SeqCst);
        Parked {
            id,
            key,
            registry: self.clone(),
            receiver: Some(receiver),
        }
    }

    /// How many polls are parked on this node.
    pub fn parked(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether a poll is parked on the queue.
    pub(crate) fn any_on(&self, namespace: &str, kind: TaskKind, queue: &str) -> bool {
        if self.parked() == 0 {
            return false;
        }
        let waiting = self.waiting.lock().expect("parked polls");
        waiting
            .get(&(namespace.to_string(), kind, queue.to_string()))
            .is_some_and(|polls| !polls.is_empty())
    }

    /// Takes the longest-parked poll of the queue that `fits` and whose client is still there
    /// (polls whose client went away are dropped on the way).
    pub(crate) fn take(self: &Arc<Self>, namespace: &str, kind: TaskKind, queue: &str, fits: impl Fn(&Poller) -> bool) -> Option<Taken> {
        let mut waiting = self.waiting.lock().expect("parked polls");
        let key = (namespace.to_string(), kind, queue.to_string());
        let polls = waiting.get_mut(&key)?;
        let before = polls.len();
        polls.retain(|w| !w.answer.is_closed());
        let mut taken = None;
        if let Some(at) = polls.iter().position(|w| fits(&w.poller)) {
            taken = Some(polls.remove(at));
        }
        let removed = before - polls.len();
        if polls.is_empty() {
            waiting.remove(&key);
        }
        self.count.fetch_sub(removed, Ordering::SeqCst);
        taken.map(|w| Taken {
            poller: w.poller,
            answer: w.answer,
            registry: self.clone(),
        })
    }

    /// Removes a poll still parked; false when a transaction took it (or it was never here).
    fn leave(&self, id: u64, key: &QueueKey) -> bool {
        let mut waiting = self.waiting.lock().expect("parked polls");
        let Some(polls) = waiting.get_mut(key) else { return false };
        let Some(at) = polls.iter().position(|w| w.id == id) else {
            return false;
        };
        polls.remove(at);
        if polls.is_empty() {
            waiting.remove(key);
        }
        self.count.fetch_sub(1, Ordering::SeqCst);
        true
    }

    /// Leases whose poll was gone when its transaction committed, taken out once.
    pub fn take_undelivered(&self) -> Vec<HandedOff> {
        std::mem::take(&mut *self.undelivered.lock().expect("undelivered hand-offs"))
    }

    /// Waits until a lease could not be delivered, then takes them all.
    pub async fn undelivered(&self) -> Vec<HandedOff> {
        loop {
            let added = self.undelivered_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let taken = self.take_undelivered();
            if !taken.is_empty() {
                return taken;
            }
            added.await;
        }
    }

    fn keep_undelivered(&self, handed: HandedOff) {
        self.undelivered.lock().expect("undelivered hand-offs").push(handed);
        self.undelivered_added.notify_one();
    }
}

/// A parked poll taken by a transaction, answered after it commits.
pub struct Taken {
    pub(crate) poller: Arc<Poller>,
    answer: oneshot::Sender<HandedOff>,
    registry: Arc<ParkedPolls>,
}

/// A lease for a parked poll, sent once its transaction commits; dropped unsent (the poll looks
/// again) when it rolls back.
pub struct Delivery {
    pub(crate) taken: Taken,
    pub(crate) handed: HandedOff,
}

impl Delivery {
    /// Answers the poll; a poll gone meanwhile leaves the lease undelivered, to be given back.
    pub fn deliver(self) {
        let Delivery { taken, handed } = self;
        if let Err(handed) = taken.answer.send(handed) {
            tracing::info!(task_id = %handed.task.id, worker_id = %taken.poller.worker_id,
                "a parked poll went away before its hand-off was answered; the task is given back");
            taken.registry.keep_undelivered(handed);
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("task_id", &self.handed.task.id)
            .field("worker_id", &self.taken.poller.worker_id)
            .finish()
    }
}

impl PartialEq for Delivery {
    fn eq(&self, other: &Self) -> bool {
        self.handed.task.id == other.handed.task.id && self.taken.poller.worker_id == other.taken.poller.worker_id
    }
}

/// A poll parked on this node. Dropping it (its client went, its handler was cancelled) leaves
/// the registry; a lease a transaction already took it for is then undelivered, and given back.
pub struct Parked {
    id: u64,
    key: QueueKey,
    registry: Arc<ParkedPolls>,
    receiver: Option<oneshot::Receiver<HandedOff>>,
}

impl Parked {
    /// Waits for a hand-off: `None` when the transaction that took this poll rolled back (look
    /// again). Cancel-safe.
    pub async fn handed(&mut self) -> Option<HandedOff> {
        let receiver = self.receiver.as_mut()?;
        let handed = receiver.await.ok();
        self.receiver = None;
        handed
    }

    /// The lease handed to this poll, if it was answered already (no wait).
    pub fn try_handed(&mut self) -> Option<HandedOff> {
        let receiver = self.receiver.as_mut()?;
        match receiver.try_recv() {
            Ok(handed) => {
                self.receiver = None;
                Some(handed)
            }
            Err(oneshot::error::TryRecvError::Closed) => {
                self.receiver = None;
                None
            }
            Err(oneshot::error::TryRecvError::Empty) => None,
        }
    }

    /// Whether this poll is done: answered, or dropped by a transaction that rolled back.
    pub fn is_spent(&self) -> bool {
        self.receiver.is_none()
    }

    /// Leaves the registry. If a transaction took this poll already, waits for its outcome: the
    /// lease when it committed, `None` when it rolled back.
    pub async fn leave(mut self) -> Option<HandedOff> {
        if self.registry.leave(self.id, &self.key) {
            self.receiver = None;
            return None;
        }
        self.handed().await
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let Some(mut receiver) = self.receiver.take() else { return };
        if self.registry.leave(self.id, &self.key) {
            return;
        }
        // A transaction took this poll: a lease already sent is given back; one not sent yet
        // finds the receiver gone when it is.
        if let Ok(handed) = receiver.try_recv() {
            self.registry.keep_undelivered(handed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poller(worker_id: &str, types: &[&str]) -> Poller {
        Poller {
            namespace: "default".into(),
            kind: TaskKind::Workflow,
            queue: "q".into(),
            worker_id: worker_id.into(),
            build_id: None,
            types: types.iter().map(|t| t.to_string()).collect(),
            lease_ms: 1_000,
            poll: None,
        }
    }

    #[test]
    fn the_longest_parked_poll_that_fits_is_taken_once() {
        let registry = Arc::new(ParkedPolls::default());
        let _a = registry.park(poller("a", &["Other"]));
        let _b = registry.park(poller("b", &[]));
        let _c = registry.park(poller("c", &[]));
        assert_eq!(registry.parked(), 3);
        let taken = registry.take("default", TaskKind::Workflow, "q", |p| p.runs("Mine")).unwrap();
        assert_eq!(taken.poller.worker_id, "b");
        assert_eq!(registry.parked(), 2);
        assert!(registry.take("default", TaskKind::Activity, "q", |_| true).is_none());
    }

    #[test]
    fn a_poll_whose_client_went_is_not_taken_and_leaves_the_count() {
        let registry = Arc::new(ParkedPolls::default());
        let mut gone = registry.park(poller("gone", &[]));
        // The client went: its receiver is dropped, its entry stays until someone looks.
        gone.receiver.take();
        let _live = registry.park(poller("live", &[]));
        let taken = registry.take("default", TaskKind::Workflow, "q", |_| true).unwrap();
        assert_eq!(taken.poller.worker_id, "live");
        assert_eq!(registry.parked(), 0);
    }

    #[tokio::test]
    async fn a_delivery_reaches_its_poll_and_an_unsent_one_lets_it_look_again() {
        let registry = Arc::new(ParkedPolls::default());
        let mut parked = registry.park(poller("a", &[]));
        let taken = registry.take("default", TaskKind::Workflow, "q", |_| true).unwrap();
        drop(taken); // a rollback
        assert!(parked.handed().await.is_none());
        assert!(!registry.leave(parked.id, &parked.key), "already out of the registry");
    }
}
