//! Workflow output streams through the control plane: a client appends items (kept up to the
//! stream's cap of unread items, each at most once by its idempotency key), closes a stream, and
//! a reader at the head releases the cap.
//! Waking the stream's readers after the commit is the caller's.

use crate::{AppResult, Services};
use capstan_engine::workflow_stream::StreamItemInput;
use capstan_store::prelude::*;
use capstan_store::{StreamAppend, StreamState, StreamTarget};

/// Appends `items`; items before the pending cap are kept even when the cap stops the rest
/// (`StreamAppend::full`).
pub async fn append<S: Services>(
    services: &S,
    target: StreamTarget,
    items: Vec<StreamItemInput>,
    max_pending_items: Option<u64>,
) -> AppResult<StreamAppend> {
    Ok(services
        .store()
        .append_stream_items(target, items, max_pending_items, services.now())
        .await?)
}

/// Closes the stream (failed with `error_reason`, if given), keeping it readable for
/// `retention_seconds`.
pub async fn close<S: Services>(
    services: &S,
    target: StreamTarget,
    error_reason: Option<String>,
    retention_seconds: Option<i64>,
) -> AppResult<StreamState> {
    Ok(services
        .store()
        .finish_stream(target, error_reason, retention_seconds, services.now())
        .await?)
}

/// A reader has read up to `next_offset`, the stream's head: its items stop counting against
/// the cap of unread items.
pub async fn caught_up<S: Services>(services: &S, target: StreamTarget, next_offset: u64) -> AppResult<()> {
    Ok(services.store().stream_caught_up(target, next_offset).await?)
}
