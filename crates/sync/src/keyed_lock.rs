//! One async lock per key, created on demand and dropped when unused: serialises concurrent
//! duplicates of one `poll_request_id`, so the second waits for the first's answer.
//!
//! Keys are client-chosen, so an entry lives exactly as long as someone holds or waits for its
//! lock. Waiting counts: every `lock()` call takes a [`Turn`] (counted under the map's lock)
//! before it waits, and gives it back when it leaves, whether it got the lock or its future was
//! dropped mid-wait. The count reaches zero only when nobody holds or waits for the lock, so a
//! newcomer that then makes a fresh lock for the key can never run beside an old holder.

use crate::shim::{lock, lock_owned, Arc, AsyncMutex, Mutex, OwnedGuard};
use std::collections::HashMap;

struct Entry {
    lock: Arc<AsyncMutex>,
    /// `Turn`s taken for this entry and not yet given back.
    turns: usize,
}

type Entries = Arc<Mutex<HashMap<String, Entry>>>;

#[derive(Clone)]
pub struct KeyedLocks {
    entries: Entries,
}

impl Default for KeyedLocks {
    fn default() -> Self {
        Self {
            entries: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl KeyedLocks {
    /// Waits until no other guard for `key` is held, then holds it. Cancel-safe: dropping the
    /// future while it waits leaves no trace.
    pub async fn lock(&self, key: &str) -> KeyedGuard {
        let turn = self.turn(key);
        let held = lock_owned(turn.lock.clone()).await;
        KeyedGuard {
            held: Some(held),
            _turn: turn,
        }
    }

    fn turn(&self, key: &str) -> Turn {
        let mut entries = lock(self.entries.lock());
        let entry = entries.entry(key.to_string()).or_insert_with(|| Entry {
            lock: Arc::new(AsyncMutex::default()),
            turns: 0,
        });
        entry.turns += 1;
        Turn {
            lock: entry.lock.clone(),
            entries: self.entries.clone(),
            key: key.to_string(),
        }
    }

    /// How many keys have an entry: those held or waited for.
    pub fn tracked(&self) -> usize {
        lock(self.entries.lock()).len()
    }
}

/// A place among the holders and waiters of one key's lock.
struct Turn {
    lock: Arc<AsyncMutex>,
    entries: Entries,
    key: String,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut entries = lock(self.entries.lock());
        if let Some(entry) = entries.get_mut(&self.key).filter(|e| Arc::ptr_eq(&e.lock, &self.lock)) {
            entry.turns -= 1;
            if entry.turns == 0 {
                entries.remove(&self.key);
            }
        }
    }
}

/// Holds a key's lock; dropping it lets the next waiter in.
pub struct KeyedGuard {
    held: Option<OwnedGuard>,
    _turn: Turn,
}

impl Drop for KeyedGuard {
    fn drop(&mut self) {
        // Release the lock, then give the turn back (a field, dropped after this body): the
        // turn is held for as long as the lock is, so the entry goes only once its lock is free
        // and a fresh lock for the key never exists beside a held one.
        self.held.take();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

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
        assert_eq!(locks.tracked(), 0);
    }

    #[tokio::test]
    async fn a_duplicate_that_gives_up_waiting_leaves_no_entry() {
        // A client that hangs up while its duplicate poll waits: the handler's future is dropped
        // mid-`lock`. Before, the entry outlived both (the first's guard saw the waiter's clone
        // of the lock and kept the entry; the waiter then left without a guard to remove it).
        let locks = KeyedLocks::default();
        let first = locks.lock("p1").await;
        let gave_up = tokio::time::timeout(Duration::from_millis(20), locks.lock("p1")).await;
        assert!(gave_up.is_err());
        drop(first);
        assert_eq!(locks.tracked(), 0);

        let first = locks.lock("p1").await;
        let waiting = tokio::spawn({
            let locks = locks.clone();
            async move { drop(locks.lock("p1").await) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first); // released while the duplicate still waits
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(locks.tracked(), 0);
    }
}
