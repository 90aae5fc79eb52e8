//! Capstan's small concurrent pieces, kept apart so that they can be model-checked:
//!
//! - [`WakeHub`] and [`KeyedWakeups`]: long-poll wake-ups per queue and per waited-for item;
//! - [`KeyedLocks`]: one async lock per client-chosen key (duplicate poll requests);
//! - [`group_commit`]: the single SQLite writer's hand-off between callers, the writer thread,
//!   the COMMIT and the wake-ups.
//!
//! Each is written over [`shim`]: std's and tokio's primitives normally, loom's under
//! `RUSTFLAGS="--cfg loom"` (with small loom-built models of tokio's `Notify`, `Mutex` and
//! `oneshot` and of std's `mpsc`, keeping the semantics relied on, as each one states). The code
//! checked is the code shipped; only the primitives under it change. `tests/loom.rs` then
//! explores every interleaving (up to a preemption bound) of a few threads and checks:
//!
//! 1. no lost wake-up: a poller subscribed before a wake is woken, whatever subscriptions come
//!    and go on the same and other keys meanwhile;
//! 2. bounded maps: an entry is never removed while someone holds it, and none is left once
//!    nobody does (queue names and poll ids are chosen by clients, so anything left behind
//!    would grow without bound);
//! 3. keyed locks: one holder per key at a time, also across an entry's removal and
//!    re-creation, and no entry left by a waiter that gave up;
//! 4. the writer's hand-off: announcements only after COMMIT and none for an undone job or a
//!    failed batch; every caller answered exactly once, with success exactly when its write is
//!    durable, also when the writer dies mid-batch or a caller stops waiting.
//!
//! Why: these are the pieces where an interleaving bug shows up as a hang (a lost wake-up costs
//! a poller its wait), a slow leak (memory per client-chosen name) or an acknowledged write
//! that is not durable: all rare, timing-dependent and invisible to ordinary tests.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p capstan-sync --release --test loom` (in a target dir of its
//! own, as `scripts/test-all.sh` does).

pub mod group_commit;
mod keyed_lock;
pub mod shim;
mod wake;

pub use keyed_lock::{KeyedGuard, KeyedLocks};
pub use wake::{KeyedWakeups, QueueKey, Subscription, WakeHub};
