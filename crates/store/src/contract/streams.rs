//! Workflow output streams: appended, finished, read, expired.

use crate::backend::Backend;
use crate::logic::streams;
use crate::*;

/// Workflow output streams through the control plane (a worker's directives are applied by
/// its completion's transaction). Every call names a run that must exist (`instance_not_found`).
pub trait StreamStore: Backend {
    /// Appends items (a known idempotency key reuses its offset); stops at the pending-item cap
    /// and keeps what came before it (`StreamAppend::full`). Opens the stream if new; refuses a
    /// closed (`stream_closed`) or errored (`stream_errored`) one.
    fn append_stream_items(
        &self,
        target: StreamTarget,
        items: Vec<capstan_engine::workflow_stream::StreamItemInput>,
        max_pending_items: Option<u64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<StreamAppend>> + Send {
        self.write(move |tx| Box::pin(async move { streams::client_append(tx, &target, &items, max_pending_items, now).await }))
    }

    /// Closes or errors a stream (`stream_not_found` if it never opened); a terminal stream is
    /// answered as it stands.
    fn finish_stream(
        &self,
        target: StreamTarget,
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<StreamState>> + Send {
        self.write(move |tx| {
            Box::pin(async move { streams::client_finish(tx, &target, error_reason.as_deref(), retention_seconds, now).await })
        })
    }

    /// The run's streams, by name.
    fn list_streams(&self, namespace: &str, workflow_id: &str, run_id: &str) -> impl Future<Output = StoreResult<Vec<StreamState>>> + Send {
        let (namespace, workflow_id, run_id) = (namespace.to_string(), workflow_id.to_string(), run_id.to_string());
        self.read(move |tx| Box::pin(async move { streams::list(tx, &namespace, &workflow_id, &run_id).await }))
    }

    /// Items from offset `from`, at most `max`, with the stream (`stream_not_found`).
    fn read_stream(
        &self,
        target: StreamTarget,
        from: u64,
        max: u64,
    ) -> impl Future<Output = StoreResult<(StreamState, Vec<StoredStreamItem>)>> + Send {
        self.read(move |tx| Box::pin(async move { streams::read(tx, &target, from, max).await }))
    }

    /// A reader reached `next_offset`; at the head, the stream's pending count drops to 0.
    fn stream_caught_up(&self, target: StreamTarget, next_offset: u64) -> impl Future<Output = StoreResult<()>> + Send {
        self.write_one(move |tx| Box::pin(async move { streams::caught_up(tx, &target, next_offset).await }))
    }

    /// Deletes closed streams past their retention, with their items.
    fn expire_streams(&self, now: Millis) -> impl Future<Output = StoreResult<u64>> + Send {
        self.write_one(move |tx| Box::pin(async move { streams::expire(tx, now).await }))
    }
}

impl<B: Backend> StreamStore for B {}
