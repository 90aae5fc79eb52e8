//! The continuous replica against a real store: every committed transaction reaches the
//! replica once, across the replica's own checkpoints (the WAL restarting many times), a
//! checkpoint it did not take (a new generation), and a restore to a point in time in the
//! middle gives exactly what was committed by then.

use capstan_backup::replicate::{self, Settings};
use capstan_backup::restore;
use capstan_backup::target::Target;
use capstan_engine::Limits;
use capstan_store::prelude::*;
use capstan_store::{NamespaceRecord, Sources, SqliteStore};
use std::time::Duration;

fn settings(target: &Target) -> Settings {
    Settings {
        target: target.clone(),
        interval: Duration::from_millis(20),
        snapshot_interval: Duration::from_secs(3600),
        retention: Duration::from_secs(3600),
        // Small, so the log restarts many times under the writes.
        checkpoint_frames: 30,
        pending_bytes_max: 64 << 20,
    }
}

fn namespace(name: &str) -> NamespaceRecord {
    NamespaceRecord {
        name: name.into(),
        // A few pages' worth, so transactions span frames.
        description: Some("x".repeat(3000)),
        retention_days: None,
        status: "active".into(),
        created_at: 0,
        updated_at: 0,
        external_payload_storage: None,
    }
}

async fn names(store: &SqliteStore) -> Vec<String> {
    let mut names: Vec<String> = store.namespaces().await.unwrap().into_iter().map(|n| n.name).collect();
    names.sort();
    names
}

async fn wait_until_shipped(replica: &replicate::Replica, sources: &Sources) {
    let asked = sources.now_ms();
    for _ in 0..500 {
        if replica.status.replicated_through_ms.load(std::sync::atomic::Ordering::Relaxed) > asked {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the replica did not ship within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_has_every_committed_transaction_and_a_point_in_time_has_only_those_before_it() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("data/capstan.db");
    let sources = Sources::system();
    let store = SqliteStore::open(&database, Limits::default(), sources.now_ms()).unwrap();
    let target = Target::create(dir.path().join("replica").to_str().unwrap()).unwrap();
    let replica = replicate::start(store.replication(), settings(&target), sources.clone())
        .await
        .unwrap();

    // Writes from several tasks at once, so group commits and checkpoints interleave.
    let write = |from: usize, to: usize| {
        let store = store.clone();
        async move {
            for i in from..to {
                store.create_namespace(namespace(&format!("ns-{i:04}"))).await.unwrap();
            }
        }
    };
    tokio::join!(write(0, 60), write(100, 160), write(200, 260));
    wait_until_shipped(&replica, &sources).await;
    let midway = names(&store).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let midway_at = sources.now_ms();
    tokio::time::sleep(Duration::from_millis(30)).await;
    tokio::join!(write(300, 360), write(400, 460));
    replica.finish().await;
    let everything = names(&store).await;
    assert!(everything.len() > midway.len());

    let generations = restore::generations(&target).await.unwrap();
    assert_eq!(generations.len(), 1, "one unbroken generation");
    assert!(generations[0].segments.len() >= 3, "{:?}", generations[0].segments);

    let restored = dir.path().join("restored/capstan.db");
    std::fs::create_dir_all(restored.parent().unwrap()).unwrap();
    let report = restore::restore(&target, &restored, None).await.unwrap();
    assert!(report.transactions > 10 && report.segments >= 3, "{report:?}");
    let opened = SqliteStore::open(&restored, Limits::default(), sources.now_ms()).unwrap();
    let got = names(&opened).await;
    let missing: Vec<_> = everything.iter().filter(|n| !got.contains(n)).collect();
    assert_eq!(got, everything, "every committed namespace, nothing else; missing {missing:?}");

    let earlier = dir.path().join("earlier.db");
    restore::restore(&target, &earlier, Some(midway_at)).await.unwrap();
    let opened = SqliteStore::open(&earlier, Limits::default(), sources.now_ms()).unwrap();
    assert_eq!(names(&opened).await, midway, "the point in time: what was committed by then");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_the_replica_did_not_take_begins_a_new_generation_and_nothing_is_lost() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("capstan.db");
    let sources = Sources::system();
    let store = SqliteStore::open(&database, Limits::default(), sources.now_ms()).unwrap();
    let target = Target::create(&format!("file://{}", dir.path().join("replica").display())).unwrap();
    let mut settings = settings(&target);
    settings.interval = Duration::from_millis(200);
    let replica = replicate::start(store.replication(), settings, sources.clone()).await.unwrap();
    for i in 0..10 {
        store.create_namespace(namespace(&format!("a-{i}"))).await.unwrap();
    }
    wait_until_shipped(&replica, &sources).await;
    // Another process checkpoints behind the replica's back, and the log restarts under frames
    // it has not read yet.
    for i in 0..10 {
        store.create_namespace(namespace(&format!("b-{i}"))).await.unwrap();
    }
    let foreign = rusqlite::Connection::open(&database).unwrap();
    let checkpointed: (i64, i64, i64) = foreign
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    eprintln!("foreign checkpoint {checkpointed:?}");
    for i in 0..10 {
        store.create_namespace(namespace(&format!("c-{i}"))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for i in 0..10 {
        store.create_namespace(namespace(&format!("d-{i}"))).await.unwrap();
    }
    replica.finish().await;
    let generations = restore::generations(&target).await.unwrap();
    assert_eq!(generations.len(), 2, "the broken chain ended its generation: {generations:?}");
    let restored = dir.path().join("restored.db");
    restore::restore(&target, &restored, None).await.unwrap();
    let opened = SqliteStore::open(&restored, Limits::default(), sources.now_ms()).unwrap();
    assert_eq!(names(&opened).await, names(&store).await);
}

#[tokio::test]
async fn a_restore_refuses_an_existing_file_and_a_time_before_the_replica() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let sources = Sources::system();
    let store = SqliteStore::open(&dir.path().join("capstan.db"), Limits::default(), sources.now_ms()).unwrap();
    let target = Target::create(dir.path().join("replica").to_str().unwrap()).unwrap();
    let replica = replicate::start(store.replication(), settings(&target), sources.clone())
        .await
        .unwrap();
    replica.finish().await;
    let existing = dir.path().join("capstan.db");
    let refused = restore::restore(&target, &existing, None).await.unwrap_err();
    assert!(refused.to_string().contains("already exists"), "{refused}");
    let refused = restore::restore(&target, &dir.path().join("new.db"), Some(1)).await.unwrap_err();
    assert!(refused.to_string().contains("nothing retained"), "{refused}");
    assert!(Target::create("ftp://host/x").is_err());
    assert!(
        Target::existing(dir.path().join("absent").to_str().unwrap()).is_err(),
        "a restore makes no directory"
    );
    assert!(Target::check("s3://").is_err() && Target::check("s3://bucket/p?colour=red").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_ridden_out_and_past_its_bound_a_new_generation_begins() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let sources = Sources::system();
    let store = SqliteStore::open(&dir.path().join("capstan.db"), Limits::default(), sources.now_ms()).unwrap();
    let location = dir.path().join("replica");
    let target = Target::create(location.to_str().unwrap()).unwrap();
    let mut settings = settings(&target);
    // Any segment held back is past the bound: the chain is given up at the first refusal.
    settings.pending_bytes_max = 1;
    let replica = replicate::start(store.replication(), settings, sources.clone()).await.unwrap();
    for i in 0..5 {
        store.create_namespace(namespace(&format!("before-{i}"))).await.unwrap();
    }
    wait_until_shipped(&replica, &sources).await;

    // The target goes away: its directory replaced by a file, so every upload fails.
    let away = dir.path().join("replica.away");
    std::fs::rename(&location, &away).unwrap();
    std::fs::write(&location, b"not a directory").unwrap();
    for i in 0..20 {
        store.create_namespace(namespace(&format!("during-{i}"))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failures = replica.status.failures.load(std::sync::atomic::Ordering::Relaxed);
    assert!(failures > 0, "the refused uploads are counted");
    let wal = replicate::wal_path(&dir.path().join("capstan.db"));
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) < 8 << 20,
        "the WAL is still checkpointed while the target is away"
    );

    std::fs::remove_file(&location).unwrap();
    std::fs::rename(&away, &location).unwrap();
    for i in 0..5 {
        store.create_namespace(namespace(&format!("after-{i}"))).await.unwrap();
    }
    wait_until_shipped(&replica, &sources).await;
    replica.finish().await;
    let generations = restore::generations(&target).await.unwrap();
    assert!(generations.len() >= 2, "the broken chain began a new generation: {generations:?}");
    let restored = dir.path().join("restored.db");
    restore::restore(&target, &restored, None).await.unwrap();
    let opened = SqliteStore::open(&restored, Limits::default(), sources.now_ms()).unwrap();
    assert_eq!(
        names(&opened).await,
        names(&store).await,
        "nothing committed while it was away is missing"
    );
}

/// A snapshot interval begins a new generation on time; retention deletes the generations no
/// point of the window needs, and every point of the window still restores exactly what was
/// committed by then, from whichever generation holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_begin_generations_and_retention_keeps_every_point_of_the_window() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let dir = tempfile::tempdir().unwrap();
    let sources = Sources::system();
    let store = SqliteStore::open(&dir.path().join("capstan.db"), Limits::default(), sources.now_ms()).unwrap();
    let target = Target::create(dir.path().join("replica").to_str().unwrap()).unwrap();
    let retention = Duration::from_millis(900);
    let settings = Settings {
        snapshot_interval: Duration::from_millis(300),
        retention,
        ..settings(&target)
    };
    let replica = replicate::start(store.replication(), settings, sources.clone()).await.unwrap();

    // Writes in steps; after each, what was committed by a known time.
    let mut points: Vec<(i64, Vec<String>)> = Vec::new();
    let began = std::time::Instant::now();
    let mut step = 0;
    let mut first_generation = None;
    while began.elapsed() < Duration::from_millis(3000) {
        for i in 0..3 {
            store.create_namespace(namespace(&format!("ns-{step:03}-{i}"))).await.unwrap();
        }
        step += 1;
        wait_until_shipped(&replica, &sources).await;
        if first_generation.is_none() {
            first_generation = Some(restore::generations(&target).await.unwrap()[0].id.clone());
        }
        let committed = names(&store).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        points.push((sources.now_ms(), committed));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let status = replica.status.clone();
    replica.finish().await;
    let finished = sources.now_ms();

    let generations = restore::generations(&target).await.unwrap();
    let begun = status.generations.load(std::sync::atomic::Ordering::Relaxed);
    assert!(begun >= 6, "a generation every 300 ms over 3 s: {begun}");
    assert!(
        (generations.len() as u64) < begun && generations.len() >= 2,
        "{} of {begun} generations kept",
        generations.len()
    );
    assert_ne!(Some(&generations[0].id), first_generation.as_ref(), "the first is deleted");
    // Expiry runs as each generation begins: by the newest one's start, every generation
    // whose successor began before the window (as it stood then) is gone.
    let newest_began = generations.last().unwrap().manifest.started_at_ms;
    for pair in generations.windows(2) {
        assert!(
            pair[1].manifest.started_at_ms >= newest_began - retention.as_millis() as i64,
            "kept a generation no point of the window needs: {pair:?}"
        );
    }
    assert!(
        generations[0].manifest.started_at_ms <= finished - retention.as_millis() as i64,
        "the oldest kept covers the start of the window"
    );

    // Every point of the window restores what was committed by then.
    let window_start = finished - retention.as_millis() as i64 + 50;
    let in_window: Vec<_> = points.iter().filter(|(at, _)| *at >= window_start).collect();
    assert!(in_window.len() >= 3, "{} points in the window", in_window.len());
    for (n, (at, committed)) in in_window.iter().enumerate() {
        let restored = dir.path().join(format!("at-{n}.db"));
        restore::restore(&target, &restored, Some(*at)).await.unwrap();
        let opened = SqliteStore::open(&restored, Limits::default(), sources.now_ms()).unwrap();
        assert_eq!(&names(&opened).await, committed, "the point {at}");
    }
}
