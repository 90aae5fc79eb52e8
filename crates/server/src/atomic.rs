//! The atomic-action executor. An activity type declared `recovery_mode: atomic` never reaches a
//! worker: its tasks wait on an internal queue, and this loop runs each one through the handler
//! the embedding application registered, inside the transaction that records the completion
//! (`Store::run_atomic_task`). It only claims types it has a handler for, so nodes with different
//! handler sets can share one database.

use crate::avro::AVRO_MEMO;
use crate::AppState;
use capstan_engine::{TaskKind, ATOMIC_QUEUE};
use capstan_store::{AtomicOutcome, Store};
use std::sync::Arc;
use std::time::Duration;

/// How long an idle executor waits before it looks again without a wake-up (a task made ready
/// by the clock or another node may come without one).
const IDLE_RECHECK: Duration = Duration::from_millis(250);

pub async fn run<S: Store>(state: Arc<AppState<S>>) {
    let actions = state.config.atomic_actions.clone();
    loop {
        let namespaces = match state.store.namespaces().await {
            Ok(namespaces) => namespaces,
            Err(error) => {
                tracing::error!(%error, "atomic executor: could not list namespaces");
                tokio::time::sleep(IDLE_RECHECK).await;
                continue;
            }
        };
        // Subscribe before looking, so a task made ready in between is not missed.
        let channels: Vec<_> = namespaces
            .iter()
            .map(|ns| state.hub.channel(&ns.name, TaskKind::Activity, ATOMIC_QUEUE))
            .collect();
        let mut waits: Vec<_> = channels.iter().map(|c| Box::pin(c.notified())).collect();
        for wait in &mut waits {
            wait.as_mut().enable();
        }
        let mut ran_any = false;
        for namespace in &namespaces {
            loop {
                match state
                    .store
                    .run_atomic_task(&namespace.name, actions.clone(), &AVRO_MEMO, state.now())
                    .await
                {
                    Ok(Some(outcome)) => {
                        ran_any = true;
                        log_outcome(&namespace.name, &outcome);
                        state.clock.kick();
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(namespace = %namespace.name, %error, "atomic executor: task not run");
                        break;
                    }
                }
            }
        }
        if ran_any {
            continue;
        }
        let any_wake = futures_any(waits);
        tokio::select! {
            _ = tokio::time::sleep(IDLE_RECHECK) => {}
            _ = any_wake => {}
        }
    }
}

async fn futures_any<F: std::future::Future<Output = ()> + Unpin>(waits: Vec<F>) {
    if waits.is_empty() {
        return std::future::pending().await;
    }
    let mut waits = waits;
    std::future::poll_fn(move |cx| {
        for wait in &mut waits {
            if std::pin::Pin::new(wait).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn log_outcome(namespace: &str, outcome: &AtomicOutcome) {
    match outcome {
        AtomicOutcome::Completed { workflow_id } => {
            tracing::info!(namespace, workflow_id = %workflow_id, "atomic action committed with its completion")
        }
        AtomicOutcome::Failed { workflow_id, message } => {
            tracing::warn!(namespace, workflow_id = %workflow_id, message, "atomic action failed; its writes rolled back")
        }
        AtomicOutcome::Refused { workflow_id } => {
            tracing::warn!(namespace, workflow_id = %workflow_id, "atomic action refused before running")
        }
    }
}
