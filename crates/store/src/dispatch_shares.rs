//! Each queue's recent dispatch per fairness class, kept in this process (as DW keeps it): the
//! state `capstan_engine::fairness` orders a poller's candidates by. Another node keeps its own;
//! each shares out what it dispatches, and priority, which needs no state, holds everywhere.

use capstan_engine::fairness::{dispatch_order, Candidate, RecentDispatch};
use capstan_engine::{Millis, TaskKind};
use std::collections::BTreeMap;
use std::sync::Mutex;

type QueueKey = (String, &'static str, String);
/// A queue's fairness classes with ready work, each with its started weight, and when read.
type ReadyClasses = (Millis, Vec<(String, u16)>);

/// How long a queue's list of classes with ready work is trusted before a claim reads it again.
pub const READY_CLASSES_TTL_MS: Millis = 2_000;

#[derive(Debug, Default)]
pub struct DispatchShares {
    queues: Mutex<BTreeMap<QueueKey, RecentDispatch>>,
    /// Each queue's fairness classes with ready work (with the weight they were started with),
    /// and when that was read.
    ready_classes: Mutex<BTreeMap<QueueKey, ReadyClasses>>,
    /// This node's claims under way, to spread concurrent ones over the candidates
    /// (`logic::claim::spread`).
    claims_under_way: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A claim's place among the claims under way on this node when it began (0: it is alone);
/// it leaves their count when dropped.
pub struct ClaimTurn {
    pub turn: usize,
    under_way: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for ClaimTurn {
    fn drop(&mut self) {
        self.under_way.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl DispatchShares {
    /// A claim's turn: how many other claims were under way on this node as it began.
    pub fn claim_turn(&self) -> ClaimTurn {
        let turn = self.claims_under_way.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ClaimTurn {
            turn,
            under_way: self.claims_under_way.clone(),
        }
    }

    /// The order to offer a queue's `candidates` in (indices into it).
    pub fn order(&self, namespace: &str, kind: TaskKind, queue: &str, candidates: &[Candidate<'_>], now: Millis) -> Vec<usize> {
        let queues = self.queues.lock().expect("dispatch shares");
        let empty = RecentDispatch::default();
        let recent = queues.get(&key(namespace, kind, queue)).unwrap_or(&empty);
        dispatch_order(candidates, recent, now)
    }

    /// A task of `class` on the queue was leased at `now`.
    pub fn record(&self, namespace: &str, kind: TaskKind, queue: &str, class: &str, now: Millis) {
        let mut queues = self.queues.lock().expect("dispatch shares");
        queues.entry(key(namespace, kind, queue)).or_default().record(class, now);
    }

    /// The queue's remembered classes with their recent dispatch scores at `now`.
    pub fn scores(&self, namespace: &str, kind: TaskKind, queue: &str, now: Millis) -> Vec<(String, f64)> {
        let queues = self.queues.lock().expect("dispatch shares");
        queues.get(&key(namespace, kind, queue)).map(|r| r.scores(now)).unwrap_or_default()
    }
}

impl DispatchShares {
    /// The queue's classes with ready work, as last read, unless that was over
    /// [`READY_CLASSES_TTL_MS`] ago.
    pub fn ready_classes(&self, namespace: &str, kind: TaskKind, queue: &str, now: Millis) -> Option<Vec<(String, u16)>> {
        let read = self.ready_classes.lock().expect("ready classes");
        read.get(&key(namespace, kind, queue))
            .filter(|(at, _)| now - at < READY_CLASSES_TTL_MS)
            .map(|(_, classes)| classes.clone())
    }

    /// The queue's classes with ready work, read at `now`.
    pub fn note_ready_classes(&self, namespace: &str, kind: TaskKind, queue: &str, classes: Vec<(String, u16)>, now: Millis) {
        let mut read = self.ready_classes.lock().expect("ready classes");
        read.insert(key(namespace, kind, queue), (now, classes));
    }
}

fn key(namespace: &str, kind: TaskKind, queue: &str) -> QueueKey {
    (namespace.to_string(), kind.as_str(), queue.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_turn_counts_the_claims_under_way_and_leaves_with_it() {
        let shares = DispatchShares::default();
        let first = shares.claim_turn();
        let second = shares.claim_turn();
        assert_eq!((first.turn, second.turn), (0, 1));
        drop(first);
        drop(second);
        assert_eq!(shares.claim_turn().turn, 0, "a claim alone again keeps arrival order");
    }
}
