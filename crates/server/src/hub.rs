//! Long-poll wake-ups. A poller subscribes to its `(namespace, kind, queue)` before it looks for
//! work; whoever makes a task ready on that queue notifies it. A missed notification costs at most
//! one re-check interval, never a lost task: the durable query is the truth, this only saves time.

use capstan_engine::TaskKind;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

type QueueKey = (String, TaskKind, String);

#[derive(Default, Clone)]
pub struct WakeHub {
    queues: Arc<Mutex<HashMap<QueueKey, Arc<Notify>>>>,
}

impl WakeHub {
    pub fn channel(&self, namespace: &str, kind: TaskKind, queue: &str) -> Arc<Notify> {
        let mut queues = self.queues.lock().expect("wake hub");
        queues.entry((namespace.to_string(), kind, queue.to_string())).or_default().clone()
    }

    pub fn wake(&self, namespace: &str, kind: TaskKind, queue: &str) {
        let notify = self
            .queues
            .lock()
            .expect("wake hub")
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
