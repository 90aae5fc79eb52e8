//! Which queues have flow-control limits, as this process last read them: a claim on any other
//! queue skips the limits row altogether, so flow control costs nothing where none is set. Read
//! again at most once a second (a limit set through another node is in force within that), and
//! at once for a limit set through this one.

use capstan_engine::{Millis, TaskKind};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// How long a read of the limited queues is trusted.
pub const REFRESH_MS: i64 = 1_000;

type QueueKey = (String, String, String);

#[derive(Debug, Default)]
pub struct LimitedQueues {
    known: Mutex<Option<(Millis, BTreeSet<QueueKey>)>>,
}

impl LimitedQueues {
    /// Whether the set must be read again before it answers at `now`.
    pub fn stale(&self, now: Millis) -> bool {
        let known = self.known.lock().expect("limited queues");
        known
            .as_ref()
            .is_none_or(|(read_at, _)| now - *read_at >= REFRESH_MS || now < *read_at)
    }

    /// The set as read from the database at `now`.
    pub fn replace(&self, keys: BTreeSet<QueueKey>, now: Millis) {
        *self.known.lock().expect("limited queues") = Some((now, keys));
    }

    /// A limit was just set on the queue through this process.
    pub fn add(&self, namespace: &str, queue: &str, kind: TaskKind) {
        if let Some((_, keys)) = self.known.lock().expect("limited queues").as_mut() {
            keys.insert(key(namespace, queue, kind));
        }
    }

    pub fn contains(&self, namespace: &str, queue: &str, kind: TaskKind) -> bool {
        let known = self.known.lock().expect("limited queues");
        known.as_ref().is_some_and(|(_, keys)| keys.contains(&key(namespace, queue, kind)))
    }
}

fn key(namespace: &str, queue: &str, kind: TaskKind) -> QueueKey {
    (namespace.to_string(), queue.to_string(), kind.as_str().to_string())
}
