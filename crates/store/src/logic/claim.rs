//! Leasing one candidate task to a poller. Picking candidates differs per backend (SQLite
//! reads a few in order; PostgreSQL locks one run with `SKIP LOCKED`); what happens to a
//! candidate is this, on both.

use super::persist::persist;
use crate::backend::Claim;
use crate::rows::*;
use crate::tx::{args, Tx};
use crate::*;

/// What became of a candidate.
pub(crate) enum Claimed {
    /// Leased to the poller (its poll request remembered).
    Leased(Box<(Task, RunState)>),
    /// Refused before dispatch (its action definition changed): the failure is recorded; try
    /// the next candidate.
    Refused,
    /// The row was out of step with the run document (leased a moment ago, or a bug): the row
    /// is repaired from the engine's view; try the next candidate.
    Stale,
    /// Not for this poller now (its worker session is not this worker's to take): left ready;
    /// try the next candidate.
    Skipped,
}

/// The poll a lease written with its run was taken by (a row lease writes it itself).
const KEEP_POLL: &str = "UPDATE tasks SET poll_request_id = $2 WHERE task_id = $1";
const REPAIR_ROW: &str = "UPDATE tasks SET status = $2 WHERE task_id = $1 AND status = 'ready'";

/// Leases `candidate` of the locked `run` to the poller of `wanted` and persists the lease; a
/// lease pays the queue's rate limit (`admitted`, when the queue has limits) and counts in its
/// fairness class's recent dispatch.
pub(crate) async fn lease_candidate<T: Tx>(
    tx: &mut T,
    mut run: RunState,
    candidate: &Candidate,
    wanted: &Claim,
    admitted: Option<&super::flow::Admitted>,
    env: &Env,
) -> StoreResult<Claimed> {
    let (task_id, now) = (candidate.task_id.clone(), wanted.now);
    // Paused after the candidate was read: its row is held now too (the pause wrote it), and
    // nothing of the run is dispatched.
    if run.paused.is_some() {
        if let Some(task) = run.tasks.get(&task_id) {
            tx.execute(REPAIR_ROW, &args![task_id.as_str(), task_row_status(&run, task)])
                .await?;
        }
        return Ok(Claimed::Stale);
    }
    let activity_type = run.tasks.get(&task_id).and_then(|t| match &t.detail {
        TaskDetail::Activity { activity_type, .. } => Some(activity_type.clone()),
        _ => None,
    });
    // A declared action is checked against its definition as of now, in this transaction, and
    // ledgered before the worker sees it.
    let definition = match (wanted.kind, activity_type) {
        (TaskKind::Activity, Some(activity_type)) => super::actions::action_definition(tx, &run.namespace, &activity_type).await?,
        _ => None,
    };
    // A session activity runs only on the session's holder: admitted (the session created,
    // renewed or taken over) in this transaction, or left for a worker that may run it.
    if wanted.kind == TaskKind::Activity {
        let requirement = run.tasks.get(&task_id).and_then(|task| run.session_of(task)).cloned();
        if let Some(requirement) = requirement {
            let session = super::sessions::admit_activity(tx, &run.namespace, &requirement, &task_id, &wanted.owner, now).await?;
            if session.is_none() {
                return Ok(Claimed::Skipped);
            }
        }
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let leased = match wanted.kind {
        TaskKind::Workflow => lease_workflow_task(&mut run, &mut cx, &task_id, &wanted.owner, wanted.lease_ms).map(Some),
        TaskKind::Activity => lease_activity_task_with(&mut run, &mut cx, &task_id, &wanted.owner, wanted.lease_ms, definition.as_ref()),
        _ => return Ok(Claimed::Stale),
    };
    let effects = cx.effects;
    match leased {
        Ok(None) => {
            persist(tx, &run, &effects, false, env).await?;
            Ok(Claimed::Refused)
        }
        Ok(Some(task)) => {
            // A lease that changes nothing but its task is written to its row alone; the run's
            // next writer folds it into the document. The row keeps the poll's request id for
            // a retry of it.
            let poll = wanted.poll.as_ref().map(|key| key.poll_request_id.as_str());
            if super::row_lease::row_only(&task, &effects) {
                if !super::row_lease::lease_row(tx, &task, now, poll).await? {
                    return Ok(Claimed::Stale);
                }
            } else {
                persist(tx, &run, &effects, false, env).await?;
                if let Some(poll) = poll {
                    tx.execute(KEEP_POLL, &args![task.id.as_str(), poll]).await?;
                }
            }
            if let Some(admitted) = admitted {
                super::flow::leased_one(tx, wanted, admitted, &candidate.class).await?;
            }
            env.dispatch
                .record(&wanted.namespace, wanted.kind, &wanted.queue, &candidate.class, now);
            Ok(Claimed::Leased(Box::new((task, run))))
        }
        Err(refusal) => {
            tracing::debug!(task_id = %task_id, run_id = %run.run_id, %refusal, "ready task row could not be leased");
            let status = run.tasks.get(&task_id).map(|t| task_row_status(&run, t)).unwrap_or("cancelled");
            tx.execute(REPAIR_ROW, &args![task_id.as_str(), status]).await?;
            Ok(Claimed::Stale)
        }
    }
}

/// Whether a ready task waits on the queue at all, and one of the poller's types (any type when
/// none); for a poll with a request id, the task that id was answered with; and, when asked, the
/// poller's registration. One statement: a poll's look costs one round trip.
pub(crate) async fn readiness<T: Tx>(tx: &mut T, ask: &LookAsk) -> StoreResult<Readiness> {
    const READY: &str = "SELECT 1 FROM tasks WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready' AND available_at <= $4";
    let mut columns = vec![
        format!("EXISTS({READY})"),
        format!("EXISTS({READY}{})", super::listing::any_of("type_name", &ask.types, 4)),
    ];
    let mut params = args![ask.namespace.as_str(), ask.kind.as_str(), ask.queue.as_str(), ask.now].to_vec();
    params.extend(ask.types.iter().map(crate::tx::Param::from));
    if let Some(key) = &ask.recall {
        let (worker, id) = (params.len() + 1, params.len() + 2);
        let answered =
            format!("FROM tasks WHERE poll_request_id = ${id} AND namespace = $1 AND queue = $3 AND kind = $2 AND lease_owner = ${worker}");
        columns.push(format!("(SELECT task_id {answered})"));
        columns.push(format!("(SELECT fence {answered})"));
        params.push(crate::tx::Param::from(key.worker_id.as_str()));
        params.push(crate::tx::Param::from(key.poll_request_id.as_str()));
    }
    let registration_at = columns.len();
    let mut from = String::new();
    if let Some(worker_id) = &ask.worker_id {
        columns.extend(WORKER_COLUMNS.split(", ").map(|column| format!("w.{column}")));
        params.push(crate::tx::Param::from(worker_id.as_str()));
        from = format!(
            " FROM (SELECT 1 AS one) o LEFT JOIN workers w ON w.namespace = $1 AND w.worker_id = ${}",
            params.len()
        );
    }
    let sql = format!("SELECT {}{from}", columns.join(", "));
    let row = tx
        .query_opt(&sql, &params)
        .await?
        .ok_or_else(|| StoreError::Storage("no readiness row".into()))?;
    let recalled = match &ask.recall {
        Some(_) => row
            .opt_str(2)?
            .map(|task| Ok::<_, StoreError>((TaskId(task.to_string()), row.int(3)? as u64)))
            .transpose()?,
        None => None,
    };
    let registration = match &ask.worker_id {
        Some(_) if row.opt_str(registration_at)?.is_none() => Some(None),
        Some(_) => Some(Some(super::fleet::worker_at(&row, registration_at)?)),
        None => None,
    };
    Ok(Readiness {
        any: row.int(0)? != 0,
        matching: row.int(1)? != 0,
        recalled,
        registration,
    })
}

/// How many ready tasks one claim reads to choose from (DW's batch).
const CANDIDATES: usize = 10;

/// A ready task a poller may be offered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub task_id: TaskId,
    pub run_id: String,
    pub priority: u8,
    /// Its fairness class (`capstan_engine::scheduling::DEFAULT_CLASS` without a key).
    pub class: String,
}

/// At most this many of the first candidates are spread over concurrent claims.
const SPREAD: usize = 4;

/// `candidates` with their head rotated by `turn` (how many other claims were under way on this
/// node as this one began; 0 keeps arrival order): the first few of the first one's priority and
/// class, which the fair order holds equally due (only their arrival order differs). Claims
/// racing on a shared database then try different runs first instead of all locking the same
/// one, each loser paying a `SKIP LOCKED` miss per run it tries.
pub(crate) fn spread(mut candidates: Vec<Candidate>, turn: usize) -> Vec<Candidate> {
    let Some((priority, class)) = candidates.first().map(|c| (c.priority, c.class.clone())) else {
        return candidates;
    };
    let equal = candidates
        .iter()
        .take(SPREAD)
        .take_while(|c| c.priority == priority && c.class == class)
        .count();
    candidates[..equal].rotate_left(turn % equal);
    candidates
}

/// The queue's ready tasks this poller may take, at most [`CANDIDATES`] read in priority and
/// then arrival order, handed back in the order to offer them: urgency first, then fairness
/// classes by their share of recent dispatch (`Env::dispatch`), weighted as the runs were
/// started or as the operator set (`admitted`'s limits). `passed` are candidates this claim
/// already passed over. A class its own limits hold back is passed over; when they hold back
/// every class there is, the claim is throttled until the soonest of them lets one through.
pub(crate) async fn candidates<T: Tx>(
    tx: &mut T,
    wanted: &Claim,
    passed: &[String],
    admitted: Option<&super::flow::Admitted>,
    env: &Env,
) -> StoreResult<Vec<Candidate>> {
    let Some(admitted) = admitted.filter(|a| a.limits.limits_keys()) else {
        return read_candidates(tx, wanted, passed, &[], admitted, env).await;
    };
    let mut held_classes: Vec<String> = Vec::new();
    let mut soonest: Option<(capstan_engine::flow::Held, i64)> = None;
    // A few rounds: classes held back are left out of the next read.
    for _ in 0..3 {
        let read = read_candidates(tx, wanted, passed, &held_classes, Some(admitted), env).await?;
        if read.is_empty() {
            break;
        }
        let mut free = Vec::new();
        for candidate in read {
            if held_classes.contains(&candidate.class) {
                continue;
            }
            match super::flow::held_class(tx, wanted, admitted, &candidate.class).await? {
                Some((held, wait)) => {
                    soonest = Some(soonest.map_or((held, wait), |s| if wait < s.1 { (held, wait) } else { s }));
                    held_classes.push(candidate.class);
                }
                None => free.push(candidate),
            }
        }
        if !free.is_empty() {
            return Ok(free);
        }
    }
    match soonest {
        Some((held, wait)) => Err(super::flow::throttled(held, wait)),
        None => Ok(Vec::new()),
    }
}

/// One read of candidates, leaving out the classes `held` (see [`candidates`]): the oldest ten,
/// and the oldest task of the few classes absent from them that the fair order wants next
/// (`class_heads`), so a class whose whole backlog arrived after another's gets its share.
async fn read_candidates<T: Tx>(
    tx: &mut T,
    wanted: &Claim,
    passed: &[String],
    held: &[String],
    admitted: Option<&super::flow::Admitted>,
    env: &Env,
) -> StoreResult<Vec<Candidate>> {
    let types = &wanted.types;
    // The usual claim (any type, nothing passed over yet) reads one text, built once.
    static ANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| candidates_sql(&[], &[], &[], None));
    let built;
    let sql = if types.is_empty() && passed.is_empty() && held.is_empty() {
        ANY.as_str()
    } else {
        built = candidates_sql(types, passed, held, None);
        built.as_str()
    };
    let mut params = args![
        wanted.namespace.as_str(),
        wanted.kind.as_str(),
        wanted.queue.as_str(),
        wanted.now,
        wanted.owner.as_str()
    ]
    .to_vec();
    params.extend(types.iter().chain(passed).chain(held).map(crate::tx::Param::from));
    let mut read = Vec::new();
    for row in tx.query(sql, &params).await? {
        read.push(candidate_of(&row, admitted)?);
    }
    // Fewer than ten read: every ready task this poller may take is among them.
    let absent = match read.len() {
        n if n < CANDIDATES => Vec::new(),
        _ => super::class_heads::wanted_next(tx, wanted, held, &read, admitted, env).await?,
    };
    for class in absent {
        let sql = candidates_sql(types, passed, held, Some(&class));
        let mut params = params.clone();
        if class != capstan_engine::scheduling::DEFAULT_CLASS {
            params.push(crate::tx::Param::from(class.as_str()));
        }
        if let Some(row) = tx.query_opt(&sql, &params).await? {
            read.push(candidate_of(&row, admitted)?);
        }
    }
    let offered: Vec<_> = read
        .iter()
        .map(|(c, weight)| capstan_engine::fairness::Candidate {
            priority: c.priority,
            class: &c.class,
            weight: *weight,
        })
        .collect();
    let order = env
        .dispatch
        .order(&wanted.namespace, wanted.kind, &wanted.queue, &offered, wanted.now);
    let mut slots: Vec<Option<Candidate>> = read.into_iter().map(|(c, _)| Some(c)).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// A candidate with its weight.
pub(crate) type Offered = (Candidate, u16);

/// A candidate row `(task_id, run_id, priority, fairness_key, fairness_weight)`, with its
/// weight (the operator's, over the one its run was started with).
fn candidate_of(row: &crate::tx::Row, admitted: Option<&super::flow::Admitted>) -> StoreResult<Offered> {
    let priority = u8::try_from(row.int(2)?).unwrap_or(capstan_engine::scheduling::PRIORITY_DEFAULT);
    let class = capstan_engine::scheduling::class_of(row.opt_str(3)?).to_string();
    let started_with = u16::try_from(row.int(4)?).unwrap_or(1);
    let weight = admitted.and_then(|a| a.limits.weight_of(&class)).unwrap_or(started_with);
    let candidate = Candidate {
        task_id: TaskId(row.text(0)?),
        run_id: row.text(1)?,
        priority,
        class,
    };
    Ok((candidate, weight))
}

/// The candidate read for a poller of `types` (any when empty), passing over `passed` and the
/// fairness classes `held`: the oldest ten, or the oldest one of `class`.
fn candidates_sql(types: &[String], passed: &[String], held: &[String], class: Option<&str>) -> String {
    let taken = 5 + types.len() + passed.len() + held.len();
    let (of_class, limit) = match class {
        None => (String::new(), CANDIDATES),
        Some(capstan_engine::scheduling::DEFAULT_CLASS) => (" AND t.fairness_key IS NULL".to_string(), 1),
        Some(_) => (format!(" AND t.fairness_key = ${}", taken + 1), 1),
    };
    format!(
        "SELECT t.task_id, t.run_id, t.priority, t.fairness_key, t.fairness_weight FROM tasks t
         WHERE t.namespace = $1 AND t.kind = $2 AND t.queue = $3 AND t.status = 'ready' AND t.available_at <= $4
           AND (t.compatibility IS NULL
                OR t.compatibility = (SELECT w.build_id FROM workers w WHERE w.namespace = $1 AND w.worker_id = $5))
           AND {} AND {}{}{}{}{of_class}
         ORDER BY t.priority, t.available_at, t.task_id LIMIT {limit}",
        sticky_free("t", "$5", "$4"),
        session_free("t", "$5", "$4"),
        super::listing::any_of("t.type_name", types, 5),
        not_any_of("t.task_id", passed, 5 + types.len()),
        not_any_of("COALESCE(t.fairness_key, '__default__')", held, 5 + types.len() + passed.len()),
    )
}

/// `AND {column} NOT IN (…)` over `values`; nothing for an empty list.
fn not_any_of(column: &str, values: &[String], taken: usize) -> String {
    if values.is_empty() {
        return String::new();
    }
    format!(" AND {column} NOT IN ({})", super::listing::marks(taken, values.len()))
}

/// The lock clause of a candidate read: its run row (`r`) locked, rows others hold skipped.
pub(crate) fn lock_run_skipping(dialect: crate::tx::Dialect) -> &'static str {
    match dialect {
        crate::tx::Dialect::Sqlite => "",
        crate::tx::Dialect::Postgres | crate::tx::Dialect::Mysql => "FOR UPDATE OF r SKIP LOCKED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(id: &str, priority: u8, class: &str) -> Candidate {
        Candidate {
            task_id: TaskId(id.into()),
            run_id: format!("run-{id}"),
            priority,
            class: class.into(),
        }
    }

    fn ids(candidates: &[Candidate]) -> Vec<&str> {
        candidates.iter().map(|c| c.task_id.0.as_str()).collect()
    }

    #[test]
    fn spreading_rotates_only_the_equally_due_head() {
        let offer = vec![
            candidate("a", 5, "x"),
            candidate("b", 5, "x"),
            candidate("c", 5, "y"),
            candidate("d", 5, "x"),
        ];
        assert_eq!(ids(&spread(offer.clone(), 0)), ["a", "b", "c", "d"]);
        assert_eq!(ids(&spread(offer.clone(), 1)), ["b", "a", "c", "d"]);
        assert_eq!(ids(&spread(offer.clone(), 2)), ["a", "b", "c", "d"]);
        let urgent_first = vec![candidate("u", 1, "x"), candidate("a", 5, "x"), candidate("b", 5, "x")];
        assert_eq!(ids(&spread(urgent_first, 7)), ["u", "a", "b"], "a more urgent task stays first");
        let many: Vec<_> = (0..10).map(|n| candidate(&n.to_string(), 5, "x")).collect();
        assert_eq!(ids(&spread(many.clone(), 3)), ["3", "0", "1", "2", "4", "5", "6", "7", "8", "9"]);
        assert_eq!(ids(&spread(many, 4)), ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
        assert!(spread(Vec::new(), 3).is_empty());
    }
}
