//! Run counts kept in the transactions that change them, so a count by status costs a handful
//! of rows however many runs there are.
//!
//! `run_counts` holds, per namespace, workflow type, task queue, class (`RunClass`: `open`,
//! `paused`, or a closed status), whether the runs are their instance's current run, and a slot, how many runs there
//! are. The writers say what changed ([`Tx::recount`]); the changes of one transaction are
//! summed and applied just before it commits, in key order ([`flush`]), so two transactions
//! never take the counter rows' locks in opposite orders, and each holds them only for its
//! COMMIT. On PostgreSQL and MySQL a run's changes go to one of [`SHARED_SLOTS`] rows (by its
//! id), so starts of one type and queue do not all wait on one row; a count sums the slots.
//!
//! Where counts change, all in this store's logic:
//! - a run is inserted (`run_rows::write_change`): +1, not current;
//! - it becomes current (`insert_instance`, `set_current_run`), the previous current run
//!   stops being so;
//! - an open run closes, or is paused or resumed (`Effects::reclassed_from`); an open run is
//!   always its instance's current one (a successor becomes current in the transaction that
//!   closes its predecessor, after it);
//! - an instance is removed (`duties::prune_instances`): its runs go.
//!
//! [`drift`] compares the counts with a full count; [`rebuild`] makes them one (the migration's
//! backfill is the same statement).

use crate::tx::{args, Dialect, Param, Tx};
use crate::*;
use std::collections::BTreeMap;

/// How many rows share one key's count on the databases with row locks.
pub(crate) const SHARED_SLOTS: u32 = 16;

/// One kept count's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CountKey {
    pub namespace: String,
    pub workflow_type: String,
    pub task_queue: String,
    /// `open`, or a closed run's status.
    pub class: String,
    /// Whether the runs are their instance's current run.
    pub current: bool,
    pub slot: u32,
}

/// Changes to kept counts, summed per key (zero sums are dropped when applied).
pub type Recounts = BTreeMap<CountKey, i64>;

/// A stored run's class (`RunClass` of its document): `open` or `paused` while it runs, its
/// status once closed.
pub(crate) fn class_of_row(status: &str, paused_at: Option<Millis>) -> &str {
    match (status, paused_at) {
        ("pending" | "running" | "waiting", None) => RunClass::Open.as_str(),
        ("pending" | "running" | "waiting", Some(_)) => RunClass::Paused.as_str(),
        (closed, _) => closed,
    }
}

/// The slot a run's changes go to.
fn slot_of(dialect: Dialect, run_id: &str) -> u32 {
    match dialect {
        // One writer: nothing waits on a row, so one row per key.
        Dialect::Sqlite => 0,
        // FNV-1a: stable across builds and nodes.
        Dialect::Postgres | Dialect::Mysql => {
            let hash = run_id
                .bytes()
                .fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
            hash % SHARED_SLOTS
        }
    }
}

/// What identifies a run for its count: `(namespace, type, queue, run id)`.
pub(crate) struct Counted<'a> {
    pub namespace: &'a str,
    pub workflow_type: &'a str,
    pub task_queue: &'a str,
    pub run_id: &'a str,
}

impl<'a> Counted<'a> {
    pub fn of(run: &'a RunState) -> Self {
        Counted {
            namespace: &run.namespace,
            workflow_type: &run.workflow_type,
            task_queue: &run.task_queue,
            run_id: run.run_id.as_str(),
        }
    }

    fn key(&self, dialect: Dialect, class: &str, current: bool) -> CountKey {
        CountKey {
            namespace: self.namespace.to_string(),
            workflow_type: self.workflow_type.to_string(),
            task_queue: self.task_queue.to_string(),
            class: class.to_string(),
            current,
            slot: slot_of(dialect, self.run_id),
        }
    }
}

/// Moves one run's count from `(class, current)` to another (`None`: it comes or goes).
pub(crate) fn shift<T: Tx>(tx: &mut T, run: &Counted<'_>, from: Option<(&str, bool)>, to: Option<(&str, bool)>) {
    let dialect = tx.dialect();
    if let Some((class, current)) = from {
        tx.recount(run.key(dialect, class, current), -1);
    }
    if let Some((class, current)) = to {
        tx.recount(run.key(dialect, class, current), 1);
    }
}

/// A new run: counted, not yet current.
pub(crate) fn inserted<T: Tx>(tx: &mut T, run: &RunState) {
    shift(tx, &Counted::of(run), None, Some((RunClass::of(run).as_str(), false)));
}

/// An open run's class changed from `from` (it closed, or was paused or resumed); an open run
/// is its instance's current one.
pub(crate) fn reclassed<T: Tx>(tx: &mut T, run: &RunState, from: RunClass) {
    let to = RunClass::of(run);
    if to != from {
        shift(tx, &Counted::of(run), Some((from.as_str(), true)), Some((to.as_str(), true)));
    }
}

/// A run became its instance's current run.
pub(crate) fn made_current<T: Tx>(tx: &mut T, run: &RunState) {
    let class = RunClass::of(run).as_str();
    shift(tx, &Counted::of(run), Some((class, false)), Some((class, true)));
}

/// The upsert of `rows` counts, its text built once per row count (a transaction changes a
/// few: one statement, one round trip).
fn upsert(rows: usize) -> &'static str {
    const MOST: usize = 16;
    static TEXTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        (1..=MOST)
            .map(|rows| {
                let values: Vec<String> = (0..rows)
                    .map(|row| {
                        let marks: Vec<String> = (1..=7).map(|c| format!("${}", row * 7 + c)).collect();
                        format!("({})", marks.join(", "))
                    })
                    .collect();
                format!(
                    "INSERT INTO run_counts (namespace, workflow_type, task_queue, run_class, is_current, slot, n) VALUES {}
                     ON CONFLICT (namespace, workflow_type, task_queue, run_class, is_current, slot) DO UPDATE SET n = run_counts.n + excluded.n",
                    values.join(", ")
                )
            })
            .collect()
    });
    &TEXTS[rows.min(MOST) - 1]
}

/// Applies the transaction's count changes, in key order. Called by every backend just before
/// COMMIT.
pub(crate) async fn flush<T: Tx>(tx: &mut T) -> StoreResult<()> {
    let recounts = tx.take_recounts();
    let changes: Vec<(&CountKey, &i64)> = recounts.iter().filter(|(_, delta)| **delta != 0).collect();
    for chunk in changes.chunks(16) {
        let mut params = Vec::with_capacity(chunk.len() * 7);
        for (key, delta) in chunk {
            params.extend(args![
                key.namespace.as_str(),
                key.workflow_type.as_str(),
                key.task_queue.as_str(),
                key.class.as_str(),
                i64::from(key.current),
                key.slot,
                **delta,
            ]);
        }
        tx.execute(upsert(chunk.len()), &params).await?;
    }
    Ok(())
}

/// Adds `delta` to `recounts[key]`, for the backends' [`Tx::recount`].
pub(crate) fn add(recounts: &mut Recounts, key: CountKey, delta: i64) {
    *recounts.entry(key).or_insert(0) += delta;
}

/// Counts per class of the current runs of `namespace`, of one type and queue if given.
pub(crate) async fn current<T: Tx>(
    tx: &mut T,
    namespace: &str,
    workflow_type: Option<&str>,
    task_queue: Option<&str>,
) -> StoreResult<Vec<(String, i64)>> {
    let mut sql = String::from("SELECT run_class, CAST(SUM(n) AS BIGINT) FROM run_counts WHERE namespace = $1 AND is_current = 1");
    let mut params: Vec<Param<'_>> = vec![namespace.into()];
    for (column, value) in [("workflow_type", workflow_type), ("task_queue", task_queue)] {
        if let Some(value) = value {
            params.push(value.into());
            sql.push_str(&format!(" AND {column} = ${}", params.len()));
        }
    }
    sql.push_str(" GROUP BY run_class ORDER BY run_class");
    let rows = tx.query(&sql, &params).await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?))).collect()
}

/// Current runs per namespace and class, every namespace (for the metrics scrape).
pub(crate) async fn current_by_namespace<T: Tx>(tx: &mut T) -> StoreResult<Vec<(String, String, i64)>> {
    let sql = "SELECT namespace, run_class, CAST(SUM(n) AS BIGINT) FROM run_counts WHERE is_current = 1
               GROUP BY namespace, run_class ORDER BY namespace, run_class";
    let rows = tx.query(sql, &[]).await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?))).collect()
}

/// Counts per class of every run of `namespace`, current or not.
pub(crate) async fn all<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<Vec<(String, i64)>> {
    let sql = "SELECT run_class, CAST(SUM(n) AS BIGINT) FROM run_counts WHERE namespace = $1 GROUP BY run_class ORDER BY run_class";
    let rows = tx.query(sql, &args![namespace]).await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?))).collect()
}

/// The counts a full count gives, by key without the slot (slot 0 in the result).
const FULL_COUNT: &str = "SELECT r.namespace, r.workflow_type, r.task_queue,
        CASE WHEN r.status NOT IN ('pending', 'running', 'waiting') THEN r.status WHEN r.paused_at IS NULL THEN 'open' ELSE 'paused' END,
        CASE WHEN i.current_run_id = r.run_id THEN 1 ELSE 0 END, COUNT(*)
     FROM runs r LEFT JOIN workflow_instances i ON i.workflow_id = r.workflow_id";
const KEPT_COUNT: &str = "SELECT namespace, workflow_type, task_queue, run_class, is_current, CAST(SUM(n) AS BIGINT) FROM run_counts";
const GROUPED: &str = " GROUP BY 1, 2, 3, 4, 5";

/// A key (slot 0) whose kept count differs from a full count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountDrift {
    pub key: CountKey,
    pub kept: i64,
    pub counted: i64,
}

/// Where the kept counts differ from a full count, in one namespace or all.
pub(crate) async fn drift<T: Tx>(tx: &mut T, namespace: Option<&str>) -> StoreResult<Vec<CountDrift>> {
    let counted = summed(tx, FULL_COUNT, "r.namespace", namespace).await?;
    let kept = summed(tx, KEPT_COUNT, "namespace", namespace).await?;
    let keys: std::collections::BTreeSet<&CountKey> = counted.keys().chain(kept.keys()).collect();
    Ok(keys
        .into_iter()
        .filter_map(|key| {
            let (kept, counted) = (kept.get(key).copied().unwrap_or(0), counted.get(key).copied().unwrap_or(0));
            (kept != counted).then(|| CountDrift {
                key: key.clone(),
                kept,
                counted,
            })
        })
        .collect())
}

async fn summed<T: Tx>(tx: &mut T, select: &str, column: &str, namespace: Option<&str>) -> StoreResult<Recounts> {
    let (sql, params): (String, Vec<Param<'_>>) = match namespace {
        Some(namespace) => (format!("{select} WHERE {column} = $1{GROUPED}"), vec![namespace.into()]),
        None => (format!("{select}{GROUPED}"), Vec::new()),
    };
    let mut sums = Recounts::new();
    for row in tx.query(&sql, &params).await? {
        let key = CountKey {
            namespace: row.text(0)?,
            workflow_type: row.text(1)?,
            task_queue: row.text(2)?,
            class: row.text(3)?,
            current: row.int(4)? != 0,
            slot: 0,
        };
        add(&mut sums, key, row.int(5)?);
    }
    sums.retain(|_, n| *n != 0);
    Ok(sums)
}

/// Makes the kept counts of `namespace` (or of every namespace) a full count's; how many keys
/// were wrong.
pub(crate) async fn rebuild<T: Tx>(tx: &mut T, namespace: Option<&str>) -> StoreResult<usize> {
    let wrong = drift(tx, namespace).await?.len();
    if wrong == 0 {
        return Ok(0);
    }
    let insert = format!(
        "INSERT INTO run_counts (namespace, workflow_type, task_queue, run_class, is_current, slot, n) {}",
        FULL_COUNT.replace("COUNT(*)", "0, COUNT(*)")
    );
    match namespace {
        Some(namespace) => {
            tx.execute("DELETE FROM run_counts WHERE namespace = $1", &args![namespace]).await?;
            tx.execute(&format!("{insert} WHERE r.namespace = $1{GROUPED}"), &args![namespace])
                .await?;
        }
        None => {
            tx.execute("DELETE FROM run_counts", &[]).await?;
            tx.execute(&format!("{insert}{GROUPED}"), &[]).await?;
        }
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_statuses_share_a_class_and_closed_ones_keep_theirs() {
        for open in ["pending", "running", "waiting"] {
            assert_eq!(class_of_row(open, None), "open");
            assert_eq!(class_of_row(open, Some(1)), "paused");
        }
        for closed in ["completed", "failed", "cancelled", "terminated"] {
            assert_eq!(class_of_row(closed, None), closed);
            assert_eq!(class_of_row(closed, Some(1)), closed);
        }
    }

    #[test]
    fn slots_spread_runs_on_shared_databases_only() {
        assert_eq!(slot_of(Dialect::Sqlite, "a"), 0);
        let slots: std::collections::BTreeSet<u32> = (0..200).map(|i| slot_of(Dialect::Postgres, &format!("run-{i}"))).collect();
        assert_eq!(slots.len(), SHARED_SLOTS as usize, "{slots:?}");
        assert_eq!(slot_of(Dialect::Mysql, "run-7"), slot_of(Dialect::Postgres, "run-7"));
    }
}
