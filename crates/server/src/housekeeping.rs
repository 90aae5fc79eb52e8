//! Removes what outlived its retention, apart from the clock so that a long purge never delays a
//! timer: closed instances past their namespace's retention, uploaded payloads nothing uses, and
//! closed output streams past their own retention.
//!
//! A pass drains: it removes expired instances a batch (one transaction) at a time until none is
//! left, so retention keeps pace with however many runs close; a pass that runs out of its time
//! budget is followed by the next one at once. Small batches keep each write short (on SQLite the
//! writer is shared with every other transaction), and each is followed by a pause as long as it
//! took, so a drain takes at most about half of the writer.

use crate::AppState;
use capstan_app::duties::{self, RetentionScope};
use capstan_store::Store;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often an idle node looks for expired instances.
const PASS_EVERY: Duration = Duration::from_secs(60);
/// Instances removed per transaction.
const RETENTION_BATCH: usize = 100;
/// How long one pass may drain before it lets the next pass (and its other chores) start over.
const PASS_BUDGET: Duration = Duration::from_secs(10);

pub(crate) async fn run<S: Store>(state: Arc<AppState<S>>) {
    loop {
        let drained = pass(&state).await;
        if !drained {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::time::sleep(PASS_EVERY).await;
    }
}

/// One pass over every namespace; whether everything expired was removed.
async fn pass<S: Store>(state: &AppState<S>) -> bool {
    let began = Instant::now();
    let mut drained = true;
    for namespace in state.store.namespaces().await.unwrap_or_default() {
        let Some(days) = namespace.retention_days else { continue };
        match drain(state, &namespace.name, days, began).await {
            Ok(done) => drained &= done,
            Err(error) => tracing::warn!(namespace = %namespace.name, %error, "retention pass failed"),
        }
    }
    // Uploaded payloads nothing uses (their instances removed, or never referenced).
    match crate::payload_storage::collect_unused(state).await {
        Ok(collected) if collected.deleted > 0 => {
            tracing::info!(deleted = collected.deleted, "unused external payloads deleted")
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "external payload collection failed"),
    }
    if let Err(error) = state.store.expire_streams(state.now()).await {
        tracing::warn!(%error, "stream retention failed");
    }
    drained
}

/// Removes one namespace's expired instances a batch at a time; whether none is left (`false`:
/// the budget ran out first).
async fn drain<S: Store>(state: &AppState<S>, namespace: &str, days: i64, began: Instant) -> capstan_store::StoreResult<bool> {
    let mut removed = 0;
    let drained = loop {
        let scope = RetentionScope::Oldest(RETENTION_BATCH);
        let batch_began = Instant::now();
        let expired = duties::retention_pass(&state.store, namespace, days, scope, state.now()).await?;
        removed += expired.len();
        if expired.len() < RETENTION_BATCH {
            break true;
        }
        if began.elapsed() >= PASS_BUDGET {
            break false;
        }
        // As long again for everyone else: a drain holds the database's writer about half the
        // time at most, so the load it runs under slows rather than stalls.
        tokio::time::sleep(batch_began.elapsed()).await;
    };
    if removed > 0 {
        tracing::info!(
            namespace,
            removed,
            retention_days = days,
            drained,
            "retention: closed workflows removed"
        );
    }
    Ok(drained)
}
