//! Workflow output streams (see `capstan_engine::workflow_stream`): one row per (run, stream)
//! with its counters, one row per item. A worker's directive is applied inside its completion's
//! transaction (`apply_stream_ops`, called by `persist`); the control plane's appends, closes
//! and reads are transactions of their own.

use crate::tx::{args, locking, Locking, Row, Tx};
use crate::*;
use capstan_engine::workflow_stream::*;
use serde_json::json;

const LOCK_STREAM: Locking = locking!(
    "SELECT status, last_offset, total_items, pending_items, error_reason, opened_at, last_appended_at, closed_at, retention_seconds
     FROM workflow_streams WHERE run_id = $1 AND stream_name = $2",
    "FOR UPDATE"
);
const LIST_STREAMS: &str =
    "SELECT status, last_offset, total_items, pending_items, error_reason, opened_at, last_appended_at, closed_at, retention_seconds, stream_name
     FROM workflow_streams WHERE run_id = $1 ORDER BY stream_name";
/// Two first appends may race (a client's and a completion's): one inserts, both then lock.
const INSERT_STREAM: &str = "INSERT INTO workflow_streams (run_id, stream_name, status, last_offset, total_items, pending_items, opened_at)
     VALUES ($1, $2, 'open', -1, 0, 0, $3) ON CONFLICT (run_id, stream_name) DO NOTHING";
const UPDATE_STREAM: &str = "UPDATE workflow_streams SET status = $3, last_offset = $4, total_items = $5, pending_items = $6,
     error_reason = $7, last_appended_at = $8, closed_at = $9, retention_seconds = $10 WHERE run_id = $1 AND stream_name = $2";
const ITEM_BY_KEY: &str = "SELECT item_offset FROM workflow_stream_items WHERE run_id = $1 AND stream_name = $2 AND idempotency_key = $3";
const INSERT_ITEM: &str = "INSERT INTO workflow_stream_items (run_id, stream_name, item_offset, idempotency_key, item)
     VALUES ($1, $2, $3, $4, $5)";
const READ_ITEMS: &str = "SELECT item_offset, idempotency_key, item FROM workflow_stream_items
     WHERE run_id = $1 AND stream_name = $2 AND item_offset >= $3 ORDER BY item_offset LIMIT $4";
const RESET_PENDING: &str =
    "UPDATE workflow_streams SET pending_items = 0 WHERE run_id = $1 AND stream_name = $2 AND last_offset < $3 AND pending_items > 0";
const RUN_EXISTS: &str = "SELECT 1 FROM runs WHERE run_id = $1 AND namespace = $2 AND workflow_id = $3";

/// A stream as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamState {
    pub stream_name: String,
    pub status: String,
    /// The newest item's offset (-1: none).
    pub last_offset: i64,
    pub total_items: u64,
    pub pending_items: u64,
    pub error_reason: Option<String>,
    pub opened_at: Millis,
    pub last_appended_at: Option<Millis>,
    pub closed_at: Option<Millis>,
    pub retention_seconds: Option<i64>,
}

impl StreamState {
    pub fn is_terminal(&self) -> bool {
        self.status != "open"
    }
}

/// One stored item (`item` is its JSON: payload, reference, types, origin, time).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredStreamItem {
    pub offset: u64,
    pub idempotency_key: Option<String>,
    pub item: Value,
}

/// Which stream of which run a control-plane request names.
#[derive(Clone, Debug)]
pub struct StreamTarget {
    pub namespace: String,
    pub workflow_id: String,
    pub run_id: String,
    pub stream_name: String,
}

/// What an append did: the offsets of its items in order (new or deduped), how many were new
/// and deduped, and whether it stopped at the pending-item cap (`Some((pending, cap))`).
#[derive(Clone, Debug, PartialEq)]
pub struct StreamAppend {
    pub stream: StreamState,
    pub accepted_offsets: Vec<u64>,
    pub accepted: u64,
    pub deduped: u64,
    pub full: Option<(u64, u64)>,
}

fn state_of(row: &Row, stream_name: &str) -> StoreResult<StreamState> {
    Ok(StreamState {
        stream_name: stream_name.to_string(),
        status: row.str(0)?.to_string(),
        last_offset: row.int(1)?,
        total_items: row.int(2)? as u64,
        pending_items: row.int(3)? as u64,
        error_reason: row.opt_str(4)?.map(str::to_string),
        opened_at: row.int(5)?,
        last_appended_at: row.opt_int(6)?,
        closed_at: row.opt_int(7)?,
        retention_seconds: row.opt_int(8)?,
    })
}

/// The stream's row, locked for the rest of the transaction when `lock` (PostgreSQL).
async fn stream_row<T: Tx>(tx: &mut T, run_id: &str, stream_name: &str, lock: bool) -> StoreResult<Option<StreamState>> {
    let sql = if lock {
        LOCK_STREAM.sql(tx.dialect())
    } else {
        LOCK_STREAM.unlocked()
    };
    let row = tx.query_opt(sql, &args![run_id, stream_name]).await?;
    row.map(|row| state_of(&row, stream_name)).transpose()
}

async fn locked<T: Tx>(tx: &mut T, run_id: &str, stream_name: &str) -> StoreResult<Option<StreamState>> {
    stream_row(tx, run_id, stream_name, true).await
}

async fn save<T: Tx>(tx: &mut T, run_id: &str, stream: &StreamState) -> StoreResult<()> {
    let args = args![
        run_id,
        &stream.stream_name,
        stream.status.as_str(),
        stream.last_offset,
        stream.total_items as i64,
        stream.pending_items as i64,
        &stream.error_reason,
        stream.last_appended_at,
        stream.closed_at,
        stream.retention_seconds,
    ];
    tx.execute(UPDATE_STREAM, &args).await.map(drop)
}

fn refused(reason: Reason, message: &str, stream: &str) -> StoreError {
    StoreError::Refused(Refusal::new(reason, message).with("stream_name", stream))
}

fn check_open(stream: &StreamState) -> StoreResult<()> {
    match stream.status.as_str() {
        "closed" => Err(refused(Reason::StreamClosed, "The stream is closed.", &stream.stream_name)),
        "errored" => Err(refused(
            Reason::StreamErrored,
            "The stream ended with an error.",
            &stream.stream_name,
        )),
        _ => Ok(()),
    }
}

/// Who wrote an item: `workflow_command` (a directive, with its command identity) or
/// `client` (the control plane).
pub(crate) struct Origin<'a> {
    pub kind: &'a str,
    pub reference: Option<&'a str>,
}

/// Appends `items` in order: a known idempotency key reuses its item's offset; a new item past
/// the pending-item cap stops the append (the items before it stay); the rest get the next
/// offsets. The stream is opened by its first append.
pub(crate) async fn append<T: Tx>(
    tx: &mut T,
    run_id: &str,
    stream_name: &str,
    items: &[StreamItemInput],
    max_pending: Option<u64>,
    origin: Origin<'_>,
    now: Millis,
) -> StoreResult<StreamAppend> {
    let mut stream = match locked(tx, run_id, stream_name).await? {
        Some(stream) => stream,
        None => {
            tx.execute(INSERT_STREAM, &args![run_id, stream_name, now]).await?;
            locked(tx, run_id, stream_name).await?.expect("just inserted")
        }
    };
    check_open(&stream)?;
    let cap = max_pending.unwrap_or(DEFAULT_MAX_PENDING_ITEMS);
    let mut outcome = StreamAppend {
        stream: stream.clone(),
        accepted_offsets: Vec::with_capacity(items.len()),
        accepted: 0,
        deduped: 0,
        full: None,
    };
    for item in items {
        if let Some(key) = item.idempotency_key.as_deref().filter(|k| !k.is_empty()) {
            if let Some(row) = tx.query_opt(ITEM_BY_KEY, &args![run_id, stream_name, key]).await? {
                outcome.accepted_offsets.push(row.int(0)? as u64);
                outcome.deduped += 1;
                continue;
            }
        }
        if stream.pending_items >= cap {
            outcome.full = Some((stream.pending_items, cap));
            break;
        }
        let offset = stream.last_offset + 1;
        let body = json!({
            "payload": item.payload.as_ref().map(Payload::envelope),
            "payload_reference": item.payload_reference,
            "payload_codec": item.payload.as_ref().map(|p| p.codec.clone()).or_else(|| item.payload_reference.as_ref().map(|_| "avro".to_string())),
            "item_type": item.item_type,
            "content_type": item.content_type,
            "origin": origin.kind,
            "origin_reference": origin.reference,
            "emitted_at": now,
        })
        .to_string();
        let key = item.idempotency_key.as_deref().filter(|k| !k.is_empty());
        super::external_payloads::record_uses_of_run(tx, run_id, &body).await?;
        tx.execute(INSERT_ITEM, &args![run_id, stream_name, offset, key, body.as_str()])
            .await?;
        stream.last_offset = offset;
        stream.total_items += 1;
        stream.pending_items += 1;
        stream.last_appended_at = Some(now);
        outcome.accepted_offsets.push(offset as u64);
        outcome.accepted += 1;
    }
    save(tx, run_id, &stream).await?;
    outcome.stream = stream;
    Ok(outcome)
}

/// Closes (`error_reason: None`) or errors a stream; a terminal stream is returned as it is.
pub(crate) async fn finish<T: Tx>(
    tx: &mut T,
    run_id: &str,
    stream_name: &str,
    error_reason: Option<&str>,
    retention_seconds: Option<i64>,
    now: Millis,
) -> StoreResult<StreamState> {
    let mut stream = locked(tx, run_id, stream_name)
        .await?
        .ok_or_else(|| refused(Reason::StreamNotFound, "No stream of this name on the run.", stream_name))?;
    if stream.is_terminal() {
        return Ok(stream);
    }
    stream.status = if error_reason.is_some() { "errored" } else { "closed" }.to_string();
    stream.error_reason = error_reason.map(str::to_string);
    stream.closed_at = Some(now);
    stream.retention_seconds = Some(retention_seconds.unwrap_or(DEFAULT_RETENTION_SECONDS));
    save(tx, run_id, &stream).await?;
    Ok(stream)
}

/// A completion's directives, in its transaction: any refusal refuses the completion.
pub(crate) async fn apply_stream_ops<T: Tx>(tx: &mut T, run: &RunState, ops: &[StreamOp]) -> StoreResult<()> {
    let run_id = run.run_id.as_str();
    for op in ops {
        let directive = &op.directive;
        let name = directive.stream_name.as_str();
        let rejected = |error: StoreError| match error {
            StoreError::Refused(refusal) => StoreError::Refused(refusal.with("outcome", "rejected").with("recorded", false)),
            other => other,
        };
        match &directive.operation {
            StreamOperation::Append { items, max_pending_items } => {
                let origin = Origin {
                    kind: "workflow_command",
                    reference: Some(&directive.command_identity),
                };
                let done = append(tx, run_id, name, items, *max_pending_items, origin, op.at)
                    .await
                    .map_err(rejected)?;
                if let Some((pending, cap)) = done.full {
                    return Err(StoreError::Refused(
                        Refusal::new(Reason::StreamFull, "The stream holds as many unread items as it may.")
                            .with("stream_name", name)
                            .with("pending_items", pending)
                            .with("max_pending_items", cap)
                            .with("outcome", "rejected")
                            .with("recorded", false),
                    ));
                }
            }
            StreamOperation::Finish {
                error_reason,
                retention_seconds,
            } => {
                finish(tx, run_id, name, error_reason.as_deref(), *retention_seconds, op.at)
                    .await
                    .map_err(rejected)?;
            }
        }
    }
    Ok(())
}

/// The run a control-plane request names must exist (`instance_not_found`, as DW answers).
async fn require_run<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<()> {
    match tx.query_opt(RUN_EXISTS, &args![run_id, namespace, workflow_id]).await? {
        Some(_) => Ok(()),
        None => Err(StoreError::Refused(
            Refusal::new(Reason::InstanceNotFound, "Workflow run not found.")
                .with("workflow_id", workflow_id)
                .with("run_id", run_id),
        )),
    }
}

async fn require_target<T: Tx>(tx: &mut T, target: &StreamTarget) -> StoreResult<()> {
    require_run(tx, &target.namespace, &target.workflow_id, &target.run_id).await
}

pub(crate) async fn client_append<T: Tx>(
    tx: &mut T,
    target: &StreamTarget,
    items: &[StreamItemInput],
    max_pending: Option<u64>,
    now: Millis,
) -> StoreResult<StreamAppend> {
    require_target(tx, target).await?;
    let origin = Origin {
        kind: "client",
        reference: None,
    };
    append(tx, &target.run_id, &target.stream_name, items, max_pending, origin, now).await
}

pub(crate) async fn client_finish<T: Tx>(
    tx: &mut T,
    target: &StreamTarget,
    error_reason: Option<&str>,
    retention_seconds: Option<i64>,
    now: Millis,
) -> StoreResult<StreamState> {
    require_target(tx, target).await?;
    finish(tx, &target.run_id, &target.stream_name, error_reason, retention_seconds, now).await
}

pub(crate) async fn list<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<Vec<StreamState>> {
    require_run(tx, namespace, workflow_id, run_id).await?;
    let rows = tx.query(LIST_STREAMS, &args![run_id]).await?;
    rows.iter().map(|row| state_of(row, row.str(9)?)).collect()
}

/// Items from `from`, at most `max`, with the stream as it stands.
pub(crate) async fn read<T: Tx>(
    tx: &mut T,
    target: &StreamTarget,
    from: u64,
    max: u64,
) -> StoreResult<(StreamState, Vec<StoredStreamItem>)> {
    require_target(tx, target).await?;
    let stream = stream_row(tx, &target.run_id, &target.stream_name, false)
        .await?
        .ok_or_else(|| refused(Reason::StreamNotFound, "No stream of this name on the run.", &target.stream_name))?;
    let rows = tx
        .query(READ_ITEMS, &args![&target.run_id, &target.stream_name, from as i64, max as i64])
        .await?;
    let items = rows
        .iter()
        .map(|row| {
            Ok(StoredStreamItem {
                offset: row.int(0)? as u64,
                idempotency_key: row.opt_str(1)?.map(str::to_string),
                item: serde_json::from_str(row.str(2)?)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok((stream, items))
}

/// A reader reached `next_offset`: if that is the stream's head, nothing is pending any more
/// (DW's advisory count: one subscriber that catches up unblocks the producer).
pub(crate) async fn caught_up<T: Tx>(tx: &mut T, target: &StreamTarget, next_offset: u64) -> StoreResult<()> {
    tx.execute(RESET_PENDING, &args![&target.run_id, &target.stream_name, next_offset as i64])
        .await
        .map(drop)
}

/// Removes closed streams past their retention, with their items; how many streams went.
pub(crate) async fn expire<T: Tx>(tx: &mut T, now: Millis) -> StoreResult<u64> {
    tx.execute(
        "DELETE FROM workflow_stream_items WHERE EXISTS (SELECT 1 FROM workflow_streams s WHERE s.run_id = workflow_stream_items.run_id
           AND s.stream_name = workflow_stream_items.stream_name AND s.closed_at IS NOT NULL
           AND s.closed_at + s.retention_seconds * 1000 < $1)",
        &args![now],
    )
    .await?;
    tx.execute(
        "DELETE FROM workflow_streams WHERE closed_at IS NOT NULL AND closed_at + retention_seconds * 1000 < $1",
        &args![now],
    )
    .await
}
