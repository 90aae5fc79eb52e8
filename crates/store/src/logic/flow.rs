//! Flow control in the claim transaction: a queue's limits row, locked by every claim of the
//! queue (so nodes sharing the database take turns and never exceed a limit together), admits a
//! lease or holds the claim back (`task_queue_throttled` with `retry_after_ms`), and records
//! the lease in its bucket. Setting and reading the limits.

use crate::backend::Claim;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;
use capstan_engine::flow::{self, Bucket, Buckets, Held, Limit, QueueLimits};
use std::collections::BTreeSet;

const LIMITED_QUEUES: &str = "SELECT namespace, task_queue, kind FROM queue_limits";
const LOCK_LIMITS: Locking = locking!(
    "SELECT limits, bucket FROM queue_limits WHERE namespace = $1 AND task_queue = $2 AND kind = $3",
    "FOR UPDATE"
);
/// Served by `tasks_leased` (MySQL: `tasks_ready`, which leads with the status).
const LEASED: &str = "SELECT COUNT(*) FROM tasks WHERE status = 'leased' AND namespace = $1 AND kind = $3 AND queue = $2";
/// A fairness class's leased tasks (`$4`: the class; runs without a key are the default class).
const LEASED_OF_CLASS: &str = "SELECT COUNT(*) FROM tasks WHERE status = 'leased' AND namespace = $1 AND kind = $3 AND queue = $2
     AND COALESCE(fairness_key, '__default__') = $4";
const SAVE_BUCKET: &str = "UPDATE queue_limits SET bucket = $4 WHERE namespace = $1 AND task_queue = $2 AND kind = $3";
const UPSERT_LIMITS: &str = "INSERT INTO queue_limits (namespace, task_queue, kind, limits, bucket, updated_at) VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (namespace, task_queue, kind) DO UPDATE SET limits = excluded.limits, bucket = excluded.bucket, updated_at = excluded.updated_at";
const DELETE_LIMITS: &str = "DELETE FROM queue_limits WHERE namespace = $1 AND task_queue = $2 AND kind = $3";
const QUEUE_LIMITS: &str =
    "SELECT kind, limits, bucket, updated_at FROM queue_limits WHERE namespace = $1 AND task_queue = $2 ORDER BY kind";

/// How soon a poll of a paused queue looks again (a resume also wakes it at once).
const PAUSED_RECHECK_MS: i64 = 1_000;

/// A claim let through by its queue's limits, to be recorded in the bucket when it leases.
pub(crate) struct Admitted {
    pub limits: QueueLimits,
    buckets: Buckets,
}

/// Holds the claim back when the queue's limits allow no lease now; `None` when the queue has
/// none. The limits row stays locked until the claim's transaction ends.
pub(crate) async fn admit<T: Tx>(tx: &mut T, wanted: &Claim, env: &Env) -> StoreResult<Option<Admitted>> {
    let (namespace, queue, kind, now) = (wanted.namespace.as_str(), wanted.queue.as_str(), wanted.kind, wanted.now);
    if !is_limited(tx, env, namespace, queue, kind, now).await? {
        return Ok(None);
    }
    let sql = LOCK_LIMITS.sql(tx.dialect());
    let Some(row) = tx.query_opt(sql, &args![namespace, queue, kind.as_str()]).await? else {
        return Ok(None);
    };
    let limits: QueueLimits = serde_json::from_str(row.str(0)?)?;
    if limits.paused.is_some() {
        return Err(throttled(Held::Paused, PAUSED_RECHECK_MS));
    }
    let Buckets { queue: bucket, keys } = serde_json::from_str(row.str(1)?)?;
    let leased = match limits.max_leased_tasks {
        Some(_) => leased(tx, namespace, queue, kind).await?,
        None => 0,
    };
    match flow::admit(&limits, bucket, leased, now) {
        (queue, Ok(())) => Ok(Some(Admitted {
            limits,
            buckets: Buckets { queue, keys },
        })),
        (_, Err((held, retry_after_ms))) => Err(throttled(held, retry_after_ms)),
    }
}

/// The refusal of a claim the limits hold back: which limit, and how soon to look again.
pub(crate) fn throttled(held: Held, retry_after_ms: i64) -> StoreError {
    Refusal::new(Reason::TaskQueueThrottled, "The queue's flow-control limits hold this claim back.")
        .with("held_by", held.as_str())
        .with("retry_after_ms", retry_after_ms)
        .into()
}

/// Whether a fairness class's own limits hold a lease of its task back now, and for how long.
pub(crate) async fn held_class<T: Tx>(tx: &mut T, wanted: &Claim, admitted: &Admitted, class: &str) -> StoreResult<Option<(Held, i64)>> {
    let Some(limit) = admitted.limits.of_key(class) else {
        return Ok(None);
    };
    let leased = match limit.max_leased_tasks {
        Some(_) => {
            let args = args![wanted.namespace.as_str(), wanted.queue.as_str(), wanted.kind.as_str(), class];
            let row = tx.query_opt(LEASED_OF_CLASS, &args).await?;
            row.map(|r| r.int(0)).transpose()?.unwrap_or(0).max(0) as u64
        }
        None => 0,
    };
    let bucket = admitted.buckets.key(limit, class, wanted.now);
    Ok(flow::admit(limit, bucket, leased, wanted.now).1.err().map(|(held, wait)| {
        let held = match held {
            Held::Rate => Held::KeyRate,
            _ => Held::KeyLeased,
        };
        (held, wait)
    }))
}

/// Whether the queue has flow-control limits (the set read again when it is stale).
pub(crate) async fn is_limited<T: Tx>(
    tx: &mut T,
    env: &Env,
    namespace: &str,
    queue: &str,
    kind: TaskKind,
    now: Millis,
) -> StoreResult<bool> {
    if env.limited.stale(now) {
        let mut keys = BTreeSet::new();
        for row in tx.query(LIMITED_QUEUES, &[]).await? {
            keys.insert((row.text(0)?, row.text(1)?, row.text(2)?));
        }
        env.limited.replace(keys, now);
    }
    Ok(env.limited.contains(namespace, queue, kind))
}

/// One lease of a task of fairness class `class` went out under `admitted`: the queue's and the
/// class's rate limits pay for it (caps alone keep nothing to write).
pub(crate) async fn leased_one<T: Tx>(tx: &mut T, wanted: &Claim, admitted: &Admitted, class: &str) -> StoreResult<()> {
    let queue = flow::spend(&admitted.limits, admitted.buckets.queue);
    let key = admitted
        .limits
        .of_key(class)
        .and_then(|limit| flow::spend(limit, admitted.buckets.key(limit, class, wanted.now)));
    if queue.is_none() && key.is_none() {
        return Ok(());
    }
    let mut buckets = admitted.buckets.clone();
    buckets.queue = queue.unwrap_or(buckets.queue);
    if let Some(key) = key {
        buckets.keys.insert(class.to_string(), key);
    }
    buckets.prune(&admitted.limits, wanted.now);
    let bucket = serde_json::to_string(&buckets)?;
    let args = args![
        wanted.namespace.as_str(),
        wanted.queue.as_str(),
        wanted.kind.as_str(),
        bucket.as_str()
    ];
    tx.execute(SAVE_BUCKET, &args).await.map(drop)
}

async fn leased<T: Tx>(tx: &mut T, namespace: &str, queue: &str, kind: TaskKind) -> StoreResult<u64> {
    let row = tx.query_opt(LEASED, &args![namespace, queue, kind.as_str()]).await?;
    Ok(row.map(|r| r.int(0)).transpose()?.unwrap_or(0).max(0) as u64)
}

/// Sets (or with no limit in it, clears) the limits of one queue and kind. A new limit starts
/// with a full bucket; a changed one keeps what is left of its bucket, up to the new burst.
pub(crate) async fn set<T: Tx>(
    tx: &mut T,
    namespace: &str,
    queue: &str,
    kind: TaskKind,
    limits: &QueueLimits,
    now: Millis,
) -> StoreResult<()> {
    let key = args![namespace, queue, kind.as_str()];
    let sql = LOCK_LIMITS.sql(tx.dialect());
    let stored = tx.query_opt(sql, &key).await?;
    // A pause is not a limit: setting or clearing limits keeps it.
    let mut limits = limits.clone();
    if let Some(row) = &stored {
        limits.paused = serde_json::from_str::<QueueLimits>(row.str(0)?)?.paused;
    }
    if limits.is_empty() {
        return tx.execute(DELETE_LIMITS, &key).await.map(drop);
    }
    let bucket = match stored {
        Some(row) => {
            let old: Buckets = serde_json::from_str(row.str(1)?)?;
            // What is left of each bucket, up to its new burst; a key no longer rate-limited
            // keeps none.
            let keys = old
                .keys
                .into_iter()
                .filter_map(|(class, bucket)| {
                    let limit = limits.of_key(&class).filter(|l| l.dispatch_rate_per_second.is_some())?;
                    let tokens = bucket.tokens.min(limit.burst());
                    Some((class, Bucket { tokens, ..bucket }))
                })
                .collect();
            let queue = Bucket {
                tokens: old.queue.tokens.min(limits.burst()),
                ..old.queue
            };
            Buckets { queue, keys }
        }
        None => Buckets {
            queue: limits.full(now),
            keys: Default::default(),
        },
    };
    let (limits, bucket) = (serde_json::to_string(&limits)?, serde_json::to_string(&bucket)?);
    let args = args![namespace, queue, kind.as_str(), limits.as_str(), bucket.as_str(), now];
    tx.execute(UPSERT_LIMITS, &args).await.map(drop)
}

/// Pauses (`Some`) or resumes (`None`) one queue's tasks of one kind, keeping its limits;
/// whether that changed anything. A resume wakes the queue's parked polls.
pub(crate) async fn set_pause<T: Tx>(
    tx: &mut T,
    namespace: &str,
    queue: &str,
    kind: TaskKind,
    pause: Option<capstan_engine::PauseRecord>,
    now: Millis,
) -> StoreResult<bool> {
    let key = args![namespace, queue, kind.as_str()];
    let sql = LOCK_LIMITS.sql(tx.dialect());
    let (mut limits, bucket) = match tx.query_opt(sql, &key).await? {
        Some(row) => (serde_json::from_str::<QueueLimits>(row.str(0)?)?, row.text(1)?),
        None => {
            let fresh = QueueLimits::default();
            let bucket = Buckets {
                queue: fresh.full(now),
                keys: Default::default(),
            };
            (fresh, serde_json::to_string(&bucket)?)
        }
    };
    if limits.paused.is_some() == pause.is_some() {
        return Ok(false);
    }
    let resumed = pause.is_none();
    limits.paused = pause;
    if limits.is_empty() {
        tx.execute(DELETE_LIMITS, &key).await?;
    } else {
        let text = serde_json::to_string(&limits)?;
        let args = args![namespace, queue, kind.as_str(), text.as_str(), bucket.as_str(), now];
        tx.execute(UPSERT_LIMITS, &args).await?;
    }
    if resumed {
        tx.announce((namespace.to_string(), kind, queue.to_string())).await?;
    }
    Ok(true)
}

/// Every paused queue kind: `(namespace, queue, kind, paused at)`.
pub(crate) async fn paused<T: Tx>(tx: &mut T) -> StoreResult<Vec<(String, String, String, Millis)>> {
    let sql = "SELECT namespace, task_queue, kind, limits FROM queue_limits ORDER BY namespace, task_queue, kind";
    let mut paused = Vec::new();
    for row in tx.query(sql, &[]).await? {
        if let Some(pause) = serde_json::from_str::<QueueLimits>(row.str(3)?)?.paused {
            paused.push((row.text(0)?, row.text(1)?, row.text(2)?, pause.paused_at));
        }
    }
    Ok(paused)
}

/// The limits set on a queue, per kind, with how many of its tasks are leased now.
pub(crate) async fn of_queue<T: Tx>(tx: &mut T, namespace: &str, queue: &str) -> StoreResult<Vec<QueueLimitState>> {
    let rows = tx.query(QUEUE_LIMITS, &args![namespace, queue]).await?;
    let mut states = Vec::new();
    for row in rows {
        let kind = match row.str(0)? {
            "workflow" => TaskKind::Workflow,
            _ => TaskKind::Activity,
        };
        states.push(QueueLimitState {
            kind,
            limits: serde_json::from_str(row.str(1)?)?,
            bucket: serde_json::from_str(row.str(2)?)?,
            updated_at: row.int(3)?,
            leased: leased(tx, namespace, queue, kind).await?,
        });
    }
    Ok(states)
}
