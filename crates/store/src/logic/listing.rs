//! Listing and counting runs for the visibility API: the current run of each instance,
//! filtered (type, queue, id, business key, status bucket, substring, search attributes, a
//! visibility filter), newest first, keyset-paged. Every value is a bind parameter; lists are
//! spelled out as `IN (…)`, which every dialect has. Where the dialects differ (how SQLite's
//! planner is kept to the attribute index's matches, its LIKE escape) [`CurrentRuns`] says so.

use crate::rows::*;
use crate::tx::{Dialect, Param, Tx};
use crate::visibility_sql::{self, SqlParam};
use crate::*;

/// A parameter of a statement built at run time, owned until the statement runs.
enum Bound {
    Text(String),
    Int(i64),
    Real(f64),
}

impl Bound {
    fn param(&self) -> Param<'_> {
        match self {
            Bound::Text(text) => Param::Text(Some(text)),
            Bound::Int(value) => Param::Int(Some(*value)),
            Bound::Real(value) => Param::Real(Some(*value)),
        }
    }
}

/// A statement's parameters as they are pushed; each push answers its placeholder.
struct Binds(Vec<Bound>);

impl Binds {
    fn push(&mut self, value: Bound) -> String {
        self.0.push(value);
        format!("${}", self.0.len())
    }

    fn params(&self) -> Vec<Param<'_>> {
        self.0.iter().map(Bound::param).collect()
    }
}

/// How one statement reads the current runs (`runs r`, kept to current ones by `is_current`).
struct CurrentRuns {
    /// The namespace column as the condition names it.
    namespace: &'static str,
    /// What follows a LIKE pattern (a backslash escapes `%` and `_` in it).
    like_escape: &'static str,
}

/// Keeps an instance's current run only: a column of the row read anyway, so a page walks the
/// namespace index newest first and stops when full.
const CURRENT_ONLY: &str = " AND r.is_current = 1";

impl CurrentRuns {
    /// For a page of runs, or a count that cannot read the attribute index's matches.
    fn of(dialect: Dialect) -> Self {
        CurrentRuns {
            namespace: "r.namespace",
            // SQLite's LIKE has no escape character unless told; backslash is the default on
            // PostgreSQL and MySQL.
            like_escape: if dialect == Dialect::Sqlite { " ESCAPE '\\'" } else { "" },
        }
    }

    /// For a count under `filter`. When every match is in the attribute index, SQLite's count
    /// reads the runs the index names: the namespace is then written `+r.namespace`, which
    /// keeps its planner (without statistics) off the namespace index, a walk of every run.
    fn count(dialect: Dialect, filter: &ListFilter) -> Self {
        let runs = Self::of(dialect);
        if dialect == Dialect::Sqlite && requires_attribute(filter) {
            return CurrentRuns {
                namespace: "+r.namespace",
                ..runs
            };
        }
        runs
    }
}

/// Whether every run `filter` selects has a row in the attribute index it names.
fn requires_attribute(filter: &ListFilter) -> bool {
    !filter.attributes.is_empty() || filter.filter.as_ref().is_some_and(|parsed| parsed.requires_attribute())
}

/// The WHERE conditions of a listing over `runs r`.
/// The status bucket is left out for counts.
fn conditions(namespace: &str, filter: &ListFilter, with_status: bool, runs: &CurrentRuns, binds: &mut Binds) -> String {
    let like_escape = runs.like_escape;
    let mut sql = format!("{} = {}", runs.namespace, binds.push(Bound::Text(namespace.to_string())));
    for (column, value) in [
        ("workflow_type", &filter.workflow_type),
        ("task_queue", &filter.task_queue),
        ("workflow_id", &filter.workflow_id),
        ("business_key", &filter.business_key),
    ] {
        if let Some(value) = value {
            sql.push_str(&format!(" AND r.{column} = {}", binds.push(Bound::Text(value.clone()))));
        }
    }
    if let Some(bucket) = filter.status_bucket.as_deref().filter(|_| with_status) {
        let marks: Vec<String> = bucket_statuses(bucket)
            .iter()
            .map(|status| binds.push(Bound::Text(status.to_string())))
            .collect();
        sql.push_str(&format!(" AND r.status IN ({})", marks.join(", ")));
        if bucket == "paused" {
            sql.push_str(" AND r.paused_at IS NOT NULL");
        }
    }
    if let Some(at_most) = filter.started_at_most {
        sql.push_str(&format!(" AND r.started_at <= {}", binds.push(Bound::Int(at_most))));
    }
    if let Some(query) = &filter.query {
        let mark = binds.push(Bound::Text(like_pattern(query)));
        sql.push_str(&format!(
            " AND (r.workflow_id LIKE {mark}{like_escape} OR r.business_key LIKE {mark}{like_escape})"
        ));
    }
    for (key, value) in &filter.attributes {
        let key = binds.push(Bound::Text(key.clone()));
        let value = binds.push(Bound::Text(value.clone()));
        sql.push_str(&format!(
            " AND r.run_id IN (SELECT run_id FROM search_attribute_index WHERE key = {key} AND value = {value})"
        ));
    }
    if let Some(parsed) = &filter.filter {
        let base = binds.0.len();
        let mut compiled = Vec::new();
        let condition = visibility_sql::compile(parsed, "r.", &mut compiled, &|i| format!("${}", base + i + 1));
        sql.push_str(&format!(" AND {condition}"));
        binds.0.extend(compiled.into_iter().map(|param| match param {
            SqlParam::Text(text) => Bound::Text(text),
            SqlParam::Number(number) => Bound::Real(number),
        }));
    }
    sql
}

/// A page of current runs, newest first; whether more follow.
pub(crate) async fn list_runs<T: Tx>(
    tx: &mut T,
    namespace: &str,
    filter: &ListFilter,
    offset: usize,
    limit: usize,
) -> StoreResult<(Vec<RunSummary>, bool)> {
    let runs = CurrentRuns::of(tx.dialect());
    let mut binds = Binds(Vec::new());
    let mut sql = format!(
        "SELECT r.state FROM runs r WHERE {}{CURRENT_ONLY}",
        conditions(namespace, filter, true, &runs, &mut binds),
    );
    if let Some(after) = &filter.after {
        let started = binds.push(Bound::Int(after.started_at));
        let run = binds.push(Bound::Text(after.run_id.clone()));
        sql.push_str(&format!(" AND (r.started_at, r.run_id) < ({started}, {run})"));
    }
    sql.push_str(&format!(
        " ORDER BY r.started_at DESC, r.run_id DESC LIMIT {} OFFSET {}",
        limit + 1,
        offset
    ));
    let rows = tx.query(&sql, &binds.params()).await?;
    let mut summaries = rows
        .iter()
        .map(|row| {
            let run: RunState = serde_json::from_str(row.str(0)?)?;
            Ok(summary_of(&run))
        })
        .collect::<StoreResult<Vec<_>>>()?;
    let more = summaries.len() > limit;
    summaries.truncate(limit);
    Ok((summaries, more))
}

/// How many current runs match, by status: from the kept counts when the filter is at most a
/// type and a queue, else counted.
pub(crate) async fn count_runs<T: Tx>(tx: &mut T, namespace: &str, filter: &ListFilter) -> StoreResult<RunCounts> {
    if kept_counts_answer(filter) {
        let mut counts = RunCounts::default();
        let kept = super::run_counts::current(tx, namespace, filter.workflow_type.as_deref(), filter.task_queue.as_deref()).await?;
        for (class, count) in kept {
            count_into(&mut counts, &class, count.max(0) as u64);
        }
        return Ok(counts);
    }
    let runs = CurrentRuns::count(tx.dialect(), filter);
    let mut binds = Binds(Vec::new());
    // Bounded: a filter matching a million runs would otherwise read them all on every count.
    let at_most = filter.count_at_most.unwrap_or(COUNT_SCAN_MAX);
    let sql = format!(
        "SELECT status, paused, COUNT(*) FROM (SELECT r.status AS status, CASE WHEN r.paused_at IS NULL THEN NULL ELSE 1 END AS paused
         FROM runs r WHERE {}{CURRENT_ONLY} LIMIT {}) matched GROUP BY 1, 2",
        conditions(namespace, filter, false, &runs, &mut binds),
        at_most + 1
    );
    let mut counts = RunCounts::default();
    let mut seen = 0;
    for row in tx.query(&sql, &binds.params()).await? {
        let class = super::run_counts::class_of_row(row.str(0)?, row.opt_int(1)?);
        let n = row.int(2)? as u64;
        count_into(&mut counts, class, n);
        seen += n;
    }
    counts.at_least = seen > at_most;
    Ok(counts)
}

/// Whether the kept counts answer a count under `filter`: they are kept per type and queue
/// only (its status bucket and cursor do not apply to counts).
fn kept_counts_answer(filter: &ListFilter) -> bool {
    let ListFilter {
        workflow_type: _,
        task_queue: _,
        after: _,
        status_bucket: _,
        query,
        attributes,
        workflow_id,
        business_key,
        filter,
        started_at_most,
        count_at_most: _,
    } = filter;
    query.is_none()
        && attributes.is_empty()
        && workflow_id.is_none()
        && business_key.is_none()
        && filter.is_none()
        && started_at_most.is_none()
}

/// `AND {column} IN ($n, …)` over `values`, numbered after `taken` parameters; nothing for an
/// empty list (no filter).
pub(crate) fn any_of(column: &str, values: &[String], taken: usize) -> String {
    if values.is_empty() {
        return String::new();
    }
    format!(" AND {column} IN ({})", marks(taken, values.len()))
}

/// `$n, …`: the placeholders of `count` parameters after `taken` ones.
pub(crate) fn marks(taken: usize, count: usize) -> String {
    (1..=count).map(|i| format!("${}", taken + i)).collect::<Vec<_>>().join(", ")
}
