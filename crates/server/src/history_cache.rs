//! Worker-plane history pages from memory. A worker without a replay cache fetches a run's
//! history from the first event on every workflow task, so serving it is the part of a step's
//! cost that grows with the run. Committed events never change (a run id is never reused, and
//! retention removes whole runs), so each event is rendered once, kept here as the JSON text a
//! page carries, and later pages copy that text. Only events read back from the store are kept,
//! so nothing here is ahead of what was committed; each node has its own cache and needs no
//! coordination. Bounded by bytes, least recently used runs leave first.

use crate::render;
use capstan_engine::RunId;
use capstan_store::{Store, StoreResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A page of events, as a JSON array, and the sequence of its last event.
pub struct Page {
    pub json: String,
    pub last: Option<u64>,
}

pub struct HistoryCache {
    budget: usize,
    inner: Mutex<Runs>,
}

#[derive(Default)]
struct Runs {
    by_run: HashMap<String, Cached>,
    bytes: usize,
    tick: u64,
}

/// Events `1..=events.len()` of a run, rendered.
#[derive(Default)]
struct Cached {
    events: Vec<Arc<str>>,
    bytes: usize,
    used: u64,
}

impl HistoryCache {
    /// A cache holding at most `budget` bytes of rendered events (0: keeps nothing).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::default(),
        }
    }

    /// Events `after < sequence <= upto` of the run, at most `limit`, read from the store only
    /// where this node has not rendered them yet.
    pub async fn page<S: Store>(
        &self,
        store: &S,
        namespace: &str,
        run_id: &RunId,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> StoreResult<Page> {
        let end = upto.min(after.saturating_add(limit as u64));
        if end <= after {
            return Ok(Page {
                json: "[]".into(),
                last: None,
            });
        }
        let (mut page, cached_len) = self.cached(run_id, after, end);
        if cached_len >= end {
            return Ok(join(&page, after));
        }
        // Read on from the end of what is cached (so the cached prefix grows without gaps),
        // or from `after` when keeping nothing.
        let from = if self.budget == 0 { after } else { cached_len };
        let stored = store.stored_history(run_id, from, end, (end - from) as usize).await?;
        let rendered: Vec<Arc<str>> = stored
            .iter()
            .map(|event| Arc::from(render::worker_event_json(namespace, event)))
            .collect();
        let contiguous = stored.iter().enumerate().all(|(i, e)| e.sequence == from + 1 + i as u64);
        if contiguous {
            self.keep(run_id, from, &rendered);
        }
        let skip = stored.iter().take_while(|e| e.sequence <= after).count();
        page.extend(rendered.into_iter().skip(skip));
        Ok(join(&page, after))
    }

    /// The cached events `after+1 ..= end` (as many as are cached), and how many events of the
    /// run are cached.
    fn cached(&self, run_id: &RunId, after: u64, end: u64) -> (Vec<Arc<str>>, u64) {
        let mut runs = self.inner.lock().expect("history cache");
        runs.tick += 1;
        let tick = runs.tick;
        let Some(cached) = runs.by_run.get_mut(run_id.as_str()) else {
            return (Vec::new(), 0);
        };
        cached.used = tick;
        let len = cached.events.len() as u64;
        let page = if len > after {
            cached.events[after as usize..len.min(end) as usize].to_vec()
        } else {
            Vec::new()
        };
        (page, len)
    }

    /// Appends events `from+1 ..` to the run's cached prefix if it ends at `from`, then trims
    /// the cache to its budget.
    fn keep(&self, run_id: &RunId, from: u64, rendered: &[Arc<str>]) {
        if self.budget == 0 || rendered.is_empty() {
            return;
        }
        let added: usize = rendered.iter().map(|text| text.len()).sum();
        let mut runs = self.inner.lock().expect("history cache");
        let held = runs
            .by_run
            .get(run_id.as_str())
            .map_or((0, 0), |c| (c.events.len() as u64, c.bytes));
        // One run may take at most a quarter of the budget, so a huge history cannot flush
        // every other run.
        if held.0 != from || held.1 + added > self.budget / 4 {
            return;
        }
        runs.tick += 1;
        let tick = runs.tick;
        let cached = runs.by_run.entry(run_id.as_str().to_string()).or_default();
        cached.events.extend(rendered.iter().cloned());
        cached.bytes += added;
        cached.used = tick;
        runs.bytes += added;
        while runs.bytes > self.budget {
            let Some(oldest) = runs.by_run.iter().min_by_key(|(_, c)| c.used).map(|(id, _)| id.clone()) else {
                break;
            };
            let evicted = runs.by_run.remove(&oldest).map(|c| c.bytes).unwrap_or(0);
            runs.bytes -= evicted;
        }
    }

    /// Whether any of the run's events are held.
    #[cfg(test)]
    fn holds(&self, run_id: &RunId) -> bool {
        self.inner.lock().expect("history cache").by_run.contains_key(run_id.as_str())
    }

    /// Bytes of rendered events held.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().expect("history cache").bytes
    }
}

/// `events` are `after+1 ..` in order, without gaps (the store's and the cache's both are).
fn join(events: &[Arc<str>], after: u64) -> Page {
    Page {
        json: join_texts(events),
        last: (!events.is_empty()).then(|| after + events.len() as u64),
    }
}

fn join_texts(events: &[Arc<str>]) -> String {
    let room = events.iter().map(|text| text.len() + 1).sum::<usize>() + 2;
    let mut json = String::with_capacity(room);
    json.push('[');
    for (index, text) in events.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        json.push_str(text);
    }
    json.push(']');
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_engine::{CommandId, Limits, Payload, StartRun, WorkflowId};
    use capstan_store::prelude::*;
    use capstan_store::{DuplicatePolicy, RunLocator, SqliteStore};
    use serde_json::{Map, Value};

    const NOW: i64 = 1_800_000_000_000;

    async fn run_with_signals(store: &SqliteStore, signals: usize) -> RunId {
        run_of(store, "cached", signals).await
    }

    async fn run_of(store: &SqliteStore, workflow_id: &str, signals: usize) -> RunId {
        let start = StartRun {
            scheduling: Default::default(),
            namespace: "default".into(),
            workflow_id: WorkflowId(workflow_id.into()),
            run_id: RunId(format!("run-{workflow_id}")),
            workflow_type: "t".into(),
            task_queue: "q".into(),
            input: Payload::avro("in"),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            command_id: CommandId(format!("start-{workflow_id}")),
            contract: None,
            compatibility: None,
            origin_trace: None,
            principal: None,
        };
        let (_, run) = store.start_workflow(start, DuplicatePolicy::Fail, NOW).await.unwrap();
        add_signals_to(store, workflow_id, 0, signals).await;
        run.run_id
    }

    async fn add_signals(store: &SqliteStore, from: usize, count: usize) {
        add_signals_to(store, "cached", from, count).await;
    }

    async fn add_signals_to(store: &SqliteStore, workflow_id: &str, from: usize, count: usize) {
        for n in from..from + count {
            store
                .mutate_run(
                    "default",
                    RunLocator::Current(WorkflowId(workflow_id.into())),
                    NOW,
                    move |run, cx| capstan_engine::signal(run, cx, "s", Payload::avro("x"), CommandId(format!("sig-{n}"))),
                )
                .await
                .unwrap();
        }
    }

    async fn uncached(store: &SqliteStore, run_id: &RunId, after: u64, upto: u64, limit: usize) -> Vec<Value> {
        let stored = store.stored_history(run_id, after, upto, limit).await.unwrap();
        stored
            .iter()
            .map(|e| serde_json::from_str(&render::worker_event_json("default", e)).unwrap())
            .collect()
    }

    fn events(page: &Page) -> Vec<Value> {
        serde_json::from_str(&page.json).unwrap()
    }

    #[tokio::test]
    async fn pages_match_the_store_whether_cached_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("c.db"), Limits::default(), NOW).unwrap();
        let run_id = run_with_signals(&store, 6).await;
        let cache = HistoryCache::new(1 << 20);
        // A later page first (fills the prefix), then the first, then one past the cached end.
        for (after, upto, limit) in [(3, 7, 2), (0, 7, 500), (2, 7, 3), (5, 7, 10)] {
            let page = cache.page(&store, "default", &run_id, after, upto, limit).await.unwrap();
            let expected = uncached(&store, &run_id, after, upto, limit).await;
            assert_eq!(events(&page), expected, "after {after} upto {upto} limit {limit}");
            assert_eq!(page.last, expected.last().map(|e| e["sequence"].as_u64().unwrap()));
        }
        let held = cache.bytes();
        assert!(held > 0);
        // Appended events are read from the store once and then served from memory.
        add_signals(&store, 6, 3).await;
        let page = cache.page(&store, "default", &run_id, 0, 10, 500).await.unwrap();
        assert_eq!(events(&page), uncached(&store, &run_id, 0, 10, 500).await);
        assert!(cache.bytes() > held);
        let empty = cache.page(&store, "default", &run_id, 10, 10, 5).await.unwrap();
        assert_eq!((empty.json.as_str(), empty.last), ("[]", None));
    }

    #[tokio::test]
    async fn the_budget_bounds_what_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("c.db"), Limits::default(), NOW).unwrap();
        let run_id = run_with_signals(&store, 20).await;
        let off = HistoryCache::new(0);
        let page = off.page(&store, "default", &run_id, 0, 21, 500).await.unwrap();
        assert_eq!(events(&page), uncached(&store, &run_id, 0, 21, 500).await);
        assert_eq!(off.bytes(), 0, "a zero budget keeps nothing");
        // A run larger than a quarter of the budget is served but not kept.
        let small = HistoryCache::new(4 * 1024);
        let page = small.page(&store, "default", &run_id, 0, 21, 500).await.unwrap();
        assert_eq!(events(&page).len(), 21);
        assert!(small.bytes() <= 1024, "{}", small.bytes());
    }

    #[tokio::test]
    async fn the_least_recently_used_run_leaves_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("c.db"), Limits::default(), NOW).unwrap();
        let runs = [
            run_of(&store, "a", 4).await,
            run_of(&store, "b", 4).await,
            run_of(&store, "c", 4).await,
        ];
        let one_run = {
            let probe = HistoryCache::new(1 << 20);
            probe.page(&store, "default", &runs[0], 0, 5, 500).await.unwrap();
            probe.bytes()
        };
        // Room for four and a half runs (so one run stays under a quarter of the budget).
        let cache = HistoryCache::new(one_run * 4 + one_run / 2);
        for run in &runs {
            cache.page(&store, "default", run, 0, 5, 500).await.unwrap();
        }
        assert!(runs.iter().all(|run| cache.holds(run)), "three runs fit");
        // Touch a; a fourth run still fits, a fifth does not: b, the least recently used, leaves.
        cache.page(&store, "default", &runs[0], 0, 5, 500).await.unwrap();
        let more = [run_of(&store, "d", 4).await, run_of(&store, "e", 4).await];
        for run in &more {
            cache.page(&store, "default", run, 0, 5, 500).await.unwrap();
        }
        assert!(cache.bytes() <= one_run * 4 + one_run / 2);
        assert!(!cache.holds(&runs[1]), "b was the least recently used");
        assert!(cache.holds(&runs[0]) && cache.holds(&more[1]), "a was touched, e was just read");
    }
}
