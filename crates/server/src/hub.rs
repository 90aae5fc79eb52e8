//! Long-poll wake-ups. A poller subscribes to its `(namespace, kind, queue)` before it looks for
//! work; whoever makes a task ready on that queue notifies it. A missed notification costs at most
//! one re-check interval, never a lost task: the durable query is the truth, this only saves time.

use capstan_engine::TaskKind;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

type QueueKey = (String, TaskKind, String);

/// Queue entries kept before the hub looks for ones nobody waits on.
const PRUNE_FLOOR: usize = 1024;

/// Clients choose queue names, so entries are dropped once no poller holds them: the map stays
/// within about twice the live subscriptions (plus [`PRUNE_FLOOR`]), however many names pass.
#[derive(Clone)]
pub struct WakeHub {
    queues: Arc<Mutex<Queues>>,
}

struct Queues {
    by_key: HashMap<QueueKey, Arc<Notify>>,
    /// Size at which the next subscription first drops the entries nobody holds.
    prune_at: usize,
}

impl Default for WakeHub {
    fn default() -> Self {
        Self {
            queues: Arc::new(Mutex::new(Queues {
                by_key: HashMap::new(),
                prune_at: PRUNE_FLOOR,
            })),
        }
    }
}

impl WakeHub {
    pub fn channel(&self, namespace: &str, kind: TaskKind, queue: &str) -> Arc<Notify> {
        let mut queues = self.queues.lock().expect("wake hub");
        if queues.by_key.len() >= queues.prune_at {
            // Held only by the map: no poller waits there (a later one subscribes afresh).
            queues.by_key.retain(|_, notify| Arc::strong_count(notify) > 1);
            queues.prune_at = (queues.by_key.len() * 2).max(PRUNE_FLOOR);
        }
        queues
            .by_key
            .entry((namespace.to_string(), kind, queue.to_string()))
            .or_default()
            .clone()
    }

    /// How many queues have an entry.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.queues.lock().expect("wake hub").by_key.len()
    }

    pub fn wake(&self, namespace: &str, kind: TaskKind, queue: &str) {
        let notify = self
            .queues
            .lock()
            .expect("wake hub")
            .by_key
            .get(&(namespace.to_string(), kind, queue.to_string()))
            .cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }
}

/// Per-key wake-ups for waiters of one item (a client waiting for its query's answer). Like the
/// queue hub, only a hint: waiters also re-read the store.
#[derive(Default, Clone)]
pub struct KeyedWakeups {
    waiters: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

impl KeyedWakeups {
    pub fn channel(&self, key: &str) -> Arc<Notify> {
        self.waiters
            .lock()
            .expect("keyed wake-ups")
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    pub fn wake(&self, key: &str) {
        let notify = self.waiters.lock().expect("keyed wake-ups").get(key).cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    pub fn forget(&self, key: &str) {
        self.waiters.lock().expect("keyed wake-ups").remove(key);
    }
}

/// One async lock per key, created on demand and dropped when unused: serialises concurrent
/// duplicates of one `poll_request_id`, so the second waits for the first's answer.
#[derive(Default, Clone)]
pub struct KeyedLocks {
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl KeyedLocks {
    pub async fn lock(&self, key: &str) -> KeyedGuard {
        let lock = self.locks.lock().expect("keyed locks").entry(key.to_string()).or_default().clone();
        let guard = lock.clone().lock_owned().await;
        KeyedGuard {
            locks: self.clone(),
            key: key.to_string(),
            lock,
            _guard: Some(guard),
        }
    }
}

pub struct KeyedGuard {
    locks: KeyedLocks,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyedGuard {
    fn drop(&mut self) {
        self._guard.take();
        let mut locks = self.locks.locks.lock().expect("keyed locks");
        // Ours, the map's and nobody else's: forget the key.
        if Arc::strong_count(&self.lock) <= 2 && locks.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, &self.lock)) {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_reaches_a_subscribed_poller() {
        let hub = WakeHub::default();
        let notify = hub.channel("default", TaskKind::Workflow, "q");
        let waiting = notify.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        hub.wake("default", TaskKind::Workflow, "q");
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("woken");
    }

    #[tokio::test]
    async fn duplicates_of_a_key_take_turns_and_the_key_is_forgotten() {
        let locks = KeyedLocks::default();
        let first = locks.lock("p1").await;
        let waiting = {
            let locks = locks.clone();
            tokio::spawn(async move {
                locks.lock("p1").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "the duplicate waits for the first");
        let other = locks.lock("p2").await; // other keys are not held up
        drop(other);
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("then it runs")
            .unwrap();
        assert!(locks.locks.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn queues_nobody_waits_on_are_forgotten_and_live_ones_kept() {
        let hub = WakeHub::default();
        let live = hub.channel("default", TaskKind::Workflow, "live");
        for n in 0..20_000 {
            drop(hub.channel("default", TaskKind::Workflow, &format!("client-chosen-{n}")));
        }
        assert!(hub.tracked() <= 2 * PRUNE_FLOOR, "{} entries for one live poller", hub.tracked());
        let waiting = live.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        hub.wake("default", TaskKind::Workflow, "live");
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the live poller is still woken");
    }

    #[tokio::test]
    async fn a_wake_on_another_queue_does_not() {
        let hub = WakeHub::default();
        let notify = hub.channel("default", TaskKind::Workflow, "q");
        let waiting = notify.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        hub.wake("default", TaskKind::Workflow, "other");
        hub.wake("default", TaskKind::Activity, "q");
        assert!(tokio::time::timeout(Duration::from_millis(50), waiting).await.is_err());
    }
}
