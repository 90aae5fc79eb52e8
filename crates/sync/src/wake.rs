//! Long-poll wake-ups. A poller subscribes to its `(namespace, kind, queue)` before it looks for
//! work; whoever makes a task ready on that queue wakes it. A missed wake-up costs at most one
//! re-check interval, never a lost task: the durable query is the truth, this only saves time.
//!
//! Clients choose queue names (and query waiters come and go with their requests), so an entry
//! lives exactly as long as someone holds a [`Subscription`] to it: the maps hold one entry per
//! key that is subscribed right now, however many names pass, and whether the subscriber ends
//! normally, with an error or by being cancelled mid-wait.

use crate::shim::{lock, Arc, Mutex, Notify};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Deref;

struct Entry {
    notify: Arc<Notify>,
    /// Live subscriptions to this entry. Counted under the map's lock rather than read off the
    /// `Arc`: a `wake` briefly holds a clone too, and must not make a leaving subscriber think
    /// someone stays.
    holders: usize,
}

type Entries<K> = Arc<Mutex<HashMap<K, Entry>>>;

/// The map under both hubs: one wake primitive per key, created on the first subscription and
/// removed with the last.
struct WakeMap<K> {
    entries: Entries<K>,
}

impl<K> Default for WakeMap<K> {
    fn default() -> Self {
        Self {
            entries: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<K> Clone for WakeMap<K> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> WakeMap<K> {
    fn subscribe(&self, key: K) -> Subscription<K> {
        let mut entries = lock(self.entries.lock());
        let entry = entries.entry(key.clone()).or_insert_with(|| Entry {
            notify: Arc::new(Notify::new()),
            holders: 0,
        });
        entry.holders += 1;
        Subscription {
            notify: entry.notify.clone(),
            entries: self.entries.clone(),
            key,
        }
    }

    fn wake<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let notify = lock(self.entries.lock()).get(key).map(|e| e.notify.clone());
        // Outside the map's lock: waking many pollers must not hold up subscribers of others.
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    /// Wakes one subscriber of `key` (tokio's `notify_one`: the longest waiting; a subscriber
    /// that leaves without taking the wake-up passes it on; with none waiting, the next to wait
    /// is woken at once). Nobody subscribed: nothing to wake, nothing kept.
    fn wake_one<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let notify = lock(self.entries.lock()).get(key).map(|e| e.notify.clone());
        if let Some(notify) = notify {
            notify.notify_one();
        }
    }

    fn forget<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        lock(self.entries.lock()).remove(key);
    }

    fn tracked(&self) -> usize {
        lock(self.entries.lock()).len()
    }
}

/// A subscription to one key's wake-ups: derefs to the wake primitive (tokio's `Notify`; take
/// `notified()` before looking, so a wake between the look and the wait is not lost). The
/// key's entry goes when its last subscription is dropped.
pub struct Subscription<K: Hash + Eq> {
    notify: Arc<Notify>,
    entries: Entries<K>,
    key: K,
}

impl<K: Hash + Eq> Deref for Subscription<K> {
    type Target = Notify;

    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl<K: Hash + Eq> Drop for Subscription<K> {
    fn drop(&mut self) {
        let mut entries = lock(self.entries.lock());
        // Not ours if the key was forgotten (and perhaps subscribed afresh) meanwhile.
        if let Some(entry) = entries.get_mut(&self.key).filter(|e| Arc::ptr_eq(&e.notify, &self.notify)) {
            entry.holders -= 1;
            if entry.holders == 0 {
                entries.remove(&self.key);
            }
        }
    }
}

/// A `(namespace, kind, queue)`.
pub type QueueKey<Kind> = (String, Kind, String);

/// The queue hub: pollers of a `(namespace, kind, queue)` and those who make its tasks ready.
pub struct WakeHub<Kind> {
    queues: WakeMap<QueueKey<Kind>>,
}

impl<Kind> Default for WakeHub<Kind> {
    fn default() -> Self {
        Self {
            queues: WakeMap::default(),
        }
    }
}

impl<Kind> Clone for WakeHub<Kind> {
    fn clone(&self) -> Self {
        Self {
            queues: self.queues.clone(),
        }
    }
}

impl<Kind: Copy + Hash + Eq> WakeHub<Kind> {
    pub fn channel(&self, namespace: &str, kind: Kind, queue: &str) -> Subscription<QueueKey<Kind>> {
        self.queues.subscribe((namespace.to_string(), kind, queue.to_string()))
    }

    /// Wakes every poller subscribed to the queue now; nobody subscribed, nothing kept.
    pub fn wake(&self, namespace: &str, kind: Kind, queue: &str) {
        self.queues.wake(&(namespace.to_string(), kind, queue.to_string()));
    }

    /// Wakes one poller of the queue: for an announcement of new work, which that poller takes
    /// or hands on (the server's long-poll loop).
    pub fn wake_one(&self, namespace: &str, kind: Kind, queue: &str) {
        self.queues.wake_one(&(namespace.to_string(), kind, queue.to_string()));
    }

    /// How many queues have an entry: those with a live subscription.
    pub fn tracked(&self) -> usize {
        self.queues.tracked()
    }
}

/// Per-key wake-ups for waiters of one item (a client waiting for its query's answer). Like the
/// queue hub, only a hint: waiters also re-read the store.
#[derive(Default, Clone)]
pub struct KeyedWakeups {
    waiters: WakeMap<String>,
}

impl KeyedWakeups {
    pub fn channel(&self, key: &str) -> Subscription<String> {
        self.waiters.subscribe(key.to_string())
    }

    pub fn wake(&self, key: &str) {
        self.waiters.wake(key);
    }

    /// Ends the key's wake-ups now, for whoever still holds a subscription. Optional: the entry
    /// also goes when its last subscription is dropped.
    pub fn forget(&self, key: &str) {
        self.waiters.forget(key);
    }

    /// How many keys have an entry.
    pub fn tracked(&self) -> usize {
        self.waiters.tracked()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[derive(Clone, Copy, PartialEq, Eq, Hash)]
    enum Kind {
        Workflow,
        Activity,
    }

    #[tokio::test]
    async fn a_wake_reaches_a_subscribed_poller() {
        let hub = WakeHub::default();
        let notify = hub.channel("default", Kind::Workflow, "q");
        let waiting = notify.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        hub.wake("default", Kind::Workflow, "q");
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("woken");
    }

    #[tokio::test]
    async fn queues_nobody_waits_on_are_forgotten_and_live_ones_kept() {
        let hub = WakeHub::default();
        let live = hub.channel("default", Kind::Workflow, "live");
        let also_live = hub.channel("default", Kind::Workflow, "live");
        for n in 0..20_000 {
            drop(hub.channel("default", Kind::Workflow, &format!("client-chosen-{n}")));
        }
        assert_eq!(hub.tracked(), 1, "one entry for the live queue, none for the passing names");
        drop(also_live);
        {
            let waiting = live.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            hub.wake("default", Kind::Workflow, "live");
            tokio::time::timeout(Duration::from_secs(1), waiting)
                .await
                .expect("the live poller is still woken");
        }
        drop(live);
        assert_eq!(hub.tracked(), 0);
    }

    #[tokio::test]
    async fn a_wake_on_another_queue_does_not() {
        let hub = WakeHub::default();
        let notify = hub.channel("default", Kind::Workflow, "q");
        let waiting = notify.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        hub.wake("default", Kind::Workflow, "other");
        hub.wake("default", Kind::Activity, "q");
        assert!(tokio::time::timeout(Duration::from_millis(50), waiting).await.is_err());
    }

    #[tokio::test]
    async fn a_cancelled_or_failed_query_waiter_leaves_no_entry() {
        // The query routes forget their key on the way out, but an error (`?`) or a client that
        // hangs up (the handler's future dropped mid-wait) skips that line.
        let answers = KeyedWakeups::default();
        let waiter = {
            let answers = answers.clone();
            tokio::spawn(async move {
                let answered = answers.channel("query-1");
                answered.notified().await;
                answers.forget("query-1");
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(answers.tracked(), 1);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(answers.tracked(), 0, "the cancelled waiter's entry went with it");
    }

    #[tokio::test]
    async fn a_forgotten_key_subscribed_afresh_is_not_removed_by_the_old_subscription() {
        let answers = KeyedWakeups::default();
        let old = answers.channel("k");
        answers.forget("k");
        let new = answers.channel("k");
        drop(old);
        assert_eq!(answers.tracked(), 1);
        {
            let waiting = new.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            answers.wake("k");
            tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("woken");
        }
        drop(new);
        assert_eq!(answers.tracked(), 0);
    }
}
