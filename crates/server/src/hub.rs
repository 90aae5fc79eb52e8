//! Long-poll wake-ups and the per-key locks of duplicate polls. The pieces live in
//! `capstan-sync`, where they are model-checked under loom; here they are named for the
//! server's task kinds. A poller subscribes to its `(namespace, kind, queue)` before it looks for
//! work; whoever makes a task ready on that queue wakes it. A missed wake-up costs at most one
//! re-check interval, never a lost task: the durable query is the truth, this only saves time.

pub use capstan_sync::{KeyedLocks, KeyedWakeups};

/// Pollers per `(namespace, kind, queue)`; an entry lives as long as a subscription to it.
pub type WakeHub = capstan_sync::WakeHub<capstan_engine::TaskKind>;
