//! Which fairness classes a claim reads the oldest task of, beside the oldest ten ready tasks.
//!
//! The oldest ten can all be one class's: a class whose whole backlog arrived after another's
//! deep one would never be offered, and fairness would not hold. So a claim also reads the
//! oldest task of the classes with ready work that are absent from those ten and that the fair
//! order wants next: the least recent dispatch per unit of weight, at most
//! [`ABSENT_CLASSES_READ`] of them.
//!
//! A queue's classes with ready work are found by skipping through the index `tasks_fair` (one
//! seek per class, not a scan of the backlog) and kept in the process for
//! `dispatch_shares::READY_CLASSES_TTL_MS`: work another node made ready joins within that.

use super::claim::Offered;
use crate::backend::Claim;
use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::scheduling::DEFAULT_CLASS;

/// At most this many fairness classes with ready work are known per queue.
const READY_CLASSES: usize = 64;
/// At most this many absent classes have their oldest task read per claim.
const ABSENT_CLASSES_READ: usize = 3;

/// Keyed classes with ready work, one index seek each, in key order, at most `$4`, each with
/// the weight its oldest ready task was started with.
const KEYED_CLASSES: &str = "WITH RECURSIVE classes (fairness_key, depth) AS (
         SELECT (SELECT MIN(fairness_key) FROM tasks WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready'), 1
         UNION ALL
         SELECT (SELECT MIN(t.fairness_key) FROM tasks t
                 WHERE t.namespace = $1 AND t.kind = $2 AND t.queue = $3 AND t.status = 'ready' AND t.fairness_key > c.fairness_key),
                c.depth + 1
         FROM classes c WHERE c.fairness_key IS NOT NULL AND c.depth < $4
     )
     SELECT c.fairness_key,
            (SELECT t.fairness_weight FROM tasks t
             WHERE t.namespace = $1 AND t.kind = $2 AND t.queue = $3 AND t.status = 'ready' AND t.fairness_key = c.fairness_key
             ORDER BY t.priority, t.available_at LIMIT 1)
     FROM classes c WHERE c.fairness_key IS NOT NULL";
/// The weight the default class's oldest ready task was started with, if it has one.
const DEFAULT_CLASS_HEAD: &str = "SELECT fairness_weight FROM tasks
     WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready' AND fairness_key IS NULL
     ORDER BY priority, available_at LIMIT 1";

/// The classes with ready work that are not among `read` (nor `held`) and that the fair order
/// wants first: least recent dispatch per unit of weight (the operator's, over the one the
/// class's oldest ready task was started with).
pub(crate) async fn wanted_next<T: Tx>(
    tx: &mut T,
    wanted: &Claim,
    held: &[String],
    read: &[Offered],
    admitted: Option<&super::flow::Admitted>,
    env: &Env,
) -> StoreResult<Vec<String>> {
    let known = ready_classes(tx, wanted, env).await?;
    let absent: Vec<(String, u16)> = known
        .into_iter()
        .filter(|(class, _)| !held.contains(class) && !read.iter().any(|(c, _)| c.class == *class))
        .collect();
    if absent.is_empty() {
        return Ok(Vec::new());
    }
    let scores = env.dispatch.scores(&wanted.namespace, wanted.kind, &wanted.queue, wanted.now);
    let mut ranked: Vec<(String, f64)> = absent
        .into_iter()
        .map(|(class, started_with)| {
            let weight = admitted.and_then(|a| a.limits.weight_of(&class)).unwrap_or(started_with).max(1);
            let score = scores.iter().find(|(c, _)| *c == class).map_or(0.0, |(_, score)| *score);
            (class, score / f64::from(weight))
        })
        .collect();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(ranked.into_iter().take(ABSENT_CLASSES_READ).map(|(class, _)| class).collect())
}

/// The queue's fairness classes with ready work, each with its started weight, as last read, or
/// read again when that was longer than `dispatch_shares::READY_CLASSES_TTL_MS` ago.
async fn ready_classes<T: Tx>(tx: &mut T, wanted: &Claim, env: &Env) -> StoreResult<Vec<(String, u16)>> {
    let (namespace, kind, queue, now) = (&wanted.namespace, wanted.kind, &wanted.queue, wanted.now);
    if let Some(classes) = env.dispatch.ready_classes(namespace, kind, queue, now) {
        return Ok(classes);
    }
    let scope = args![namespace.as_str(), kind.as_str(), queue.as_str()];
    let mut classes = Vec::new();
    if let Some(row) = tx.query_opt(DEFAULT_CLASS_HEAD, &scope).await? {
        classes.push((DEFAULT_CLASS.to_string(), started_weight(&row, 0)?));
    }
    let mut keyed = scope.to_vec();
    keyed.push(crate::tx::Param::from(READY_CLASSES as i64));
    for row in tx.query(KEYED_CLASSES, &keyed).await? {
        classes.push((row.text(0)?, started_weight(&row, 1)?));
    }
    env.dispatch.note_ready_classes(namespace, kind, queue, classes.clone(), now);
    Ok(classes)
}

/// The weight in column `index`, 1 when it is missing or out of range.
fn started_weight(row: &crate::tx::Row, index: usize) -> StoreResult<u16> {
    let weight = row.opt_int(index)?;
    Ok(weight.and_then(|w| u16::try_from(w).ok()).unwrap_or(1))
}
