//! The wake-up log: MySQL's stand-in for `NOTIFY`. A transaction that makes a task ready
//! appends `(namespace, kind, queue)` to `wake_events`; the row is visible only once that
//! transaction commits. Every node follows the log every [`FOLLOW_EVERY`] and wakes its
//! pollers for what other nodes appended. An announcement is a hint: one missed (a row that
//! committed out of id order past the look-back) costs at most the pollers' one-second
//! re-check, never a task. Rows older than [`KEEP_MS`] are pruned by whichever node gets there.

use super::LocalWakeups;
use mysql_async::prelude::Queryable;
use mysql_async::Pool;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS wake_events (id BIGINT AUTO_INCREMENT PRIMARY KEY,
  origin VARCHAR(64) NOT NULL, namespace VARCHAR(255) NOT NULL, kind VARCHAR(32) NOT NULL, queue VARCHAR(255) NOT NULL,
  created_at BIGINT NOT NULL, INDEX wake_events_age (created_at))";
/// Appended in the transaction that made the task ready (`$1` origin, then the wake key).
pub(super) const APPEND: &str = "INSERT INTO wake_events (origin, namespace, kind, queue, created_at)
     VALUES ($1, $2, $3, $4, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))";
const FOLLOW_EVERY: Duration = Duration::from_millis(100);
const KEEP_MS: i64 = 60_000;
const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// Ids are handed out at insert and rows appear at commit, so a row can appear below the
/// highest id already seen; each read looks this far back and skips what it delivered.
const LOOK_BACK: i64 = 256;
const BATCH: usize = 1000;

/// Follows the log until nobody listens, forwarding other nodes' announcements to `local`.
pub(super) async fn follow(pool: Pool, origin: Arc<str>, local: LocalWakeups) {
    let mut follower = Follower {
        after: None,
        delivered: HashSet::new(),
        order: VecDeque::new(),
    };
    let mut pruned = Instant::now();
    while !local.is_closed() {
        if let Err(error) = follower.read(&pool, &origin, &local).await {
            tracing::warn!(%error, "wake-up log unreadable; pollers fall back to their re-check");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if pruned.elapsed() >= PRUNE_EVERY {
            pruned = Instant::now();
            if let Err(error) = prune(&pool).await {
                tracing::warn!(%error, "could not prune the wake-up log");
            }
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

struct Follower {
    /// The highest id seen; `None` until the first read, which starts at the log's end.
    after: Option<i64>,
    /// Ids delivered within the look-back, oldest first in `order`.
    delivered: HashSet<i64>,
    order: VecDeque<i64>,
}

impl Follower {
    async fn read(&mut self, pool: &Pool, origin: &str, local: &LocalWakeups) -> Result<(), mysql_async::Error> {
        let mut conn = pool.get_conn().await?;
        let after = match self.after {
            Some(after) => after,
            None => {
                let end: Option<Option<i64>> = conn.query_first("SELECT MAX(id) FROM wake_events").await?;
                let end = end.flatten().unwrap_or(0);
                self.after = Some(end);
                end
            }
        };
        let rows: Vec<(i64, String, String, String)> = conn
            .exec(
                "SELECT id, namespace, kind, queue FROM wake_events WHERE id > ? AND origin <> ? ORDER BY id LIMIT ?",
                (after - LOOK_BACK, origin, BATCH as u64),
            )
            .await?;
        for (id, namespace, kind, queue) in rows {
            self.after = Some(self.after.unwrap_or(0).max(id));
            if !self.delivered.insert(id) {
                continue;
            }
            self.order.push_back(id);
            if let Some(kind) = crate::rows::wake_kind(&kind) {
                let _ = local.send((namespace, kind, queue));
            }
        }
        let floor = self.after.unwrap_or(0) - LOOK_BACK;
        while self.order.front().is_some_and(|id| *id <= floor) {
            if let Some(id) = self.order.pop_front() {
                self.delivered.remove(&id);
            }
        }
        Ok(())
    }
}

async fn prune(pool: &Pool) -> Result<(), mysql_async::Error> {
    let mut conn = pool.get_conn().await?;
    conn.exec_drop(
        "DELETE FROM wake_events WHERE created_at < CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - ? LIMIT 10000",
        (KEEP_MS,),
    )
    .await
}
