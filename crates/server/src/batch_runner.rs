//! Runs batch operations (`docs/batch-operations.md`) on this node: when a step of one is due,
//! claims it and runs it (a step another node holds is skipped). It looks at the batches with
//! a read, so an idle node writes nothing.

use crate::AppState;
use capstan_store::Store;
use std::sync::Arc;
use std::time::Duration;

/// How long an idle runner waits before it looks again (a new batch starts within it).
const IDLE_RECHECK_MS: i64 = 250;

pub(crate) async fn run<S: Store>(state: Arc<AppState<S>>) {
    loop {
        let now = state.now();
        let due = match state.store.next_batch_step().await {
            Ok(next) => next.is_some_and(|at| at <= now),
            Err(error) => {
                tracing::warn!(%error, "batch operations: could not read what is due");
                false
            }
        };
        if due {
            // A step runs as a task of its own: were one to panic, this runner would live on
            // (the step is taken again when its hold runs out) instead of dying with it.
            let stepping = Arc::clone(&state);
            let step = tokio::spawn(async move { capstan_app::batches::step(&*stepping, &stepping.config.server_id).await });
            match step.await {
                Ok(Ok(true)) => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => tracing::warn!(%error, "batch operations: a step failed; it is taken again"),
                Err(error) => tracing::error!(%error, "batch operations: a step panicked; it is taken again"),
            }
        }
        tokio::time::sleep(Duration::from_millis(IDLE_RECHECK_MS as u64)).await;
    }
}
