//! The store behaviour suite on SQLite, plus what only a file-backed store can show.

use capstan_engine::*;
use capstan_store::suite::{start_request, NOW};
use capstan_store::*;

/// A fresh store in its own temporary directory, removed when the guard drops.
async fn fresh() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("capstan.db"), Limits::default(), NOW).expect("open");
    (store, dir)
}

capstan_store::store_suite!(fresh());

#[tokio::test]
async fn committed_changes_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/capstan.db");
    let run_id = {
        let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
        let (_, run) = store
            .start_workflow(start_request("durable", "q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
        run.run_id
    };
    let store = SqliteStore::open(&path, Limits::default(), NOW).expect("reopen and re-run migrations");
    let run = store
        .load_run("default", RunLocator::Current(WorkflowId("durable".into())))
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(run.run_id, run_id);
    assert!(store.namespace_exists("default").await.unwrap());
}

#[tokio::test]
async fn the_database_runs_in_wal_mode_with_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    let _store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_panicking_transition_is_undone_and_the_writer_keeps_going() {
    let (store, _dir) = fresh().await;
    let (_, run) = store
        .start_workflow(start_request("panicky", "q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let locator = || RunLocator::Current(WorkflowId("panicky".into()));
    let result = store
        .mutate_run(
            "default",
            locator(),
            NOW,
            |run: &mut RunState, cx: &mut Cx| -> Result<(), Refusal> {
                signal(run, cx, "s", Payload::avro("x"), "c".into())?;
                panic!("a bug in a transition")
            },
        )
        .await;
    assert!(matches!(result, Err(StoreError::Storage(_))), "the caller sees a storage error");
    let after = store.load_run("default", locator()).await.unwrap().unwrap();
    assert_eq!(after.last_sequence, run.last_sequence, "nothing of the panicking job was kept");
    store
        .mutate_run("default", locator(), NOW, |run, cx| {
            signal(run, cx, "s", Payload::avro("x"), "c".into())
        })
        .await
        .expect("later writes still work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_run_document_opens_one_incident_and_blocks_the_run() {
    let (store, dir) = fresh().await;
    let path = dir.path().join("capstan.db");
    let tamper: capstan_store::suite::Tamper = Box::new(move |run_id, document| {
        let path = path.clone();
        Box::pin(async move {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
            conn.execute("UPDATE runs SET state = ?1 WHERE run_id = ?2", [&document, &run_id])
                .unwrap();
        })
    });
    capstan_store::suite::an_unreadable_run_document_opens_one_incident_and_blocks_the_run(store, tamper).await;
}

/// A workflow task's claim writes its task row and leaves the run document alone; the report
/// writes the document once, with the lease folded in and closed, and clears the row's copy.
#[tokio::test]
async fn a_workflow_claim_writes_its_task_row_and_not_the_run_document() {
    let (store, dir) = fresh().await;
    let (_, run) = store
        .start_workflow(start_request("row-only", "q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("capstan.db")).unwrap();
    let document = || -> String {
        conn.query_row("SELECT state FROM runs WHERE run_id = ?1", [run.run_id.as_str()], |r| r.get(0))
            .unwrap()
    };
    let row = |task: &TaskId| -> (String, Option<String>) {
        conn.query_row("SELECT status, pending_lease FROM tasks WHERE task_id = ?1", [task.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    };
    let before = document();
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("the workflow task");
    assert_eq!(document(), before, "the claim left the run document alone");
    let (status, pending) = row(&task.id);
    assert_eq!(status, "leased");
    assert!(pending.is_some_and(|p| p.contains("\"owner\":\"w\"")));

    let id = task.id.clone();
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            let timer = WorkflowCommand::StartTimer {
                delay_seconds: 60,
                tags: Default::default(),
            };
            complete_workflow_task(run, cx, &id, "w", 1, vec![timer])
        })
        .await
        .expect("the report under the row's lease");
    assert_ne!(document(), before);
    assert_eq!(row(&task.id), ("completed".to_string(), None));
}

/// A lease kept on its row whose run document was written around it (by a node that did not
/// know it) still stands, on the history its worker was handed.
#[tokio::test]
async fn a_lease_written_around_folds_on_the_history_its_worker_saw() {
    let (store, dir) = fresh().await;
    store
        .start_workflow(start_request("around", "q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let (task, leased) = store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("the workflow task");
    assert!(leased.last_sequence > 1);
    let conn = rusqlite::Connection::open(dir.path().join("capstan.db")).unwrap();
    let seen = leased.last_sequence - 1;
    conn.execute(
        "UPDATE tasks SET pending_lease = json_set(pending_lease, '$.snapshot', ?2) WHERE task_id = ?1",
        rusqlite::params![task.id.as_str(), seen as i64],
    )
    .unwrap();
    let read = store.load_run("default", RunLocator::Task(task.id.clone())).await.unwrap().unwrap();
    let folded = &read.tasks[&task.id];
    assert_eq!(folded.lease(), task.lease());
    assert!(matches!(folded.detail, TaskDetail::Workflow { history_snapshot, .. } if history_snapshot == seen));
}

/// The migration that made history a rowid table (36) keeps every event, in order, with its
/// hash chain, and the key still refuses a second event at one sequence.
#[tokio::test]
async fn history_moves_to_an_appended_table_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    let mut runs = Vec::new();
    {
        let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
        for id in ["moved-1", "moved-2", "moved-3"] {
            let (_, run) = store
                .start_workflow(start_request(id, "q"), DuplicatePolicy::Fail, NOW)
                .await
                .unwrap();
            runs.push(run.run_id.clone());
        }
    }
    // As a database from before the migration: history clustered by its key.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE clustered (run_id TEXT NOT NULL, sequence INTEGER NOT NULL, event_id TEXT NOT NULL,
             event_type TEXT NOT NULL, payload TEXT NOT NULL, workflow_task_id TEXT, workflow_command_id TEXT,
             recorded_at INTEGER NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
             PRIMARY KEY (run_id, sequence)) WITHOUT ROWID;
         INSERT INTO clustered SELECT run_id, sequence, event_id, event_type, payload, workflow_task_id,
             workflow_command_id, recorded_at, prev_hash, hash FROM history_events;
         DROP TABLE history_events;
         ALTER TABLE clustered RENAME TO history_events;
         DELETE FROM schema_migrations WHERE version = 36;",
    )
    .unwrap();
    let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
    let table: String = conn
        .query_row("SELECT sql FROM sqlite_master WHERE name = 'history_events'", [], |r| r.get(0))
        .unwrap();
    assert!(!table.contains("WITHOUT ROWID"), "{table}");
    for run_id in &runs {
        let events = store.stored_history(run_id, 0, u64::MAX, 100).await.unwrap();
        assert!(events.len() >= 2, "{events:?}");
        assert!(events.iter().enumerate().all(|(i, e)| e.sequence == i as u64 + 1));
        assert!(events.windows(2).all(|pair| pair[1].prev_hash == pair[0].hash), "the chain holds");
    }
    let second = conn.execute(
        "INSERT INTO history_events SELECT * FROM history_events WHERE run_id = ?1 AND sequence = 1",
        [runs[0].as_str()],
    );
    assert!(second.is_err(), "one event per (run, sequence)");
}

/// The migration that marks superseded runs (37) finds them in a database from before it: a
/// listing and a count then skip them by that mark alone.
#[tokio::test]
async fn superseded_runs_are_marked_by_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    {
        let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
        store
            .start_workflow(start_request("chained", "q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
    }
    // As a database from before the migration, with an earlier run of the instance.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE runs DROP COLUMN is_current;
         INSERT INTO runs (run_id, namespace, workflow_id, run_number, workflow_type, task_queue, status, business_key,
             started_at, closed_at, state, paused_at)
         SELECT 'earlier-run', namespace, workflow_id, 0, workflow_type, task_queue, 'completed', business_key,
             started_at + 1, started_at, state, NULL FROM runs;
         DELETE FROM schema_migrations WHERE version = 37;",
    )
    .unwrap();
    let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
    let marked: Vec<(String, i64)> = conn
        .prepare("SELECT run_id, is_current FROM runs ORDER BY run_id = 'earlier-run'")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(marked.len(), 2);
    assert_eq!((marked[0].1, &marked[1].0, marked[1].1), (1, &"earlier-run".to_string(), 0));
    let (listed, _) = store.list_runs("default", ListFilter::default(), 0, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let counted = ListFilter {
        query: Some("chained".into()),
        ..ListFilter::default()
    };
    assert_eq!(store.count_runs("default", counted).await.unwrap().running, 1);
}

/// The migration that brought kept run counts fills them from the runs already there, and a
/// count that drifted (written by hand here) is found and rebuilt.
#[tokio::test]
async fn kept_run_counts_are_backfilled_and_a_drift_is_found_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    {
        let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
        for id in ["before-1", "before-2"] {
            store
                .start_workflow(start_request(id, "q"), DuplicatePolicy::Fail, NOW)
                .await
                .unwrap();
        }
    }
    // As a database from before the migration: no table, the migration not applied.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE run_counts; DELETE FROM schema_migrations WHERE version = 32; UPDATE schema_floor SET floor = 1")
        .unwrap();
    let store = SqliteStore::open(&path, Limits::default(), NOW).unwrap();
    let running = |store: SqliteStore| async move { store.count_runs("default", ListFilter::default()).await.unwrap().running };
    assert_eq!(running(store.clone()).await, 2, "backfilled");
    assert!(store.run_count_drift(None).await.unwrap().is_empty());
    let floor: i64 = conn.query_row("SELECT floor FROM schema_floor", [], |r| r.get(0)).unwrap();
    assert_eq!(
        floor, 37,
        "binaries that do not count runs (nor hold paused runs, nor mark superseded ones) may no longer open the file"
    );

    conn.execute("UPDATE run_counts SET n = n + 5", []).unwrap();
    assert_eq!(running(store.clone()).await, 7);
    let drift = store.run_count_drift(Some("default")).await.unwrap();
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!((drift[0].kept, drift[0].counted), (7, 2));
    assert_eq!(store.recount_runs(Some("default")).await.unwrap(), 1);
    assert_eq!(running(store.clone()).await, 2);
    assert!(store.run_count_drift(None).await.unwrap().is_empty());
}
