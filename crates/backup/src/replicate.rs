//! The continuous replica of a running SQLite server: every `interval` the transactions
//! committed since the last look are read from the WAL and shipped as one segment; the replica
//! alone checkpoints, with the writer parked, after it has copied every frame the checkpoint
//! moves into the database file, so the WAL never restarts under frames not yet shipped.
//!
//! The recovery point is the time since the last shipped segment: one interval plus the
//! upload, while the target is reachable. What is read but not yet uploaded waits in memory, up
//! to `pending_bytes_max`; past that the chain is given up and a new generation (a snapshot)
//! starts once the target answers again, so the WAL stays bounded whatever the target does.

use crate::layout::{self, Manifest};
use crate::target::Target;
use crate::wal::{self, Position};
use crate::{io, Error, Result};
use capstan_engine::Millis;
use capstan_store::{Sources, SqliteReplication};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone)]
pub struct Settings {
    pub target: Target,
    /// How often committed transactions are shipped: the recovery point while all is well.
    pub interval: Duration,
    /// How often a new generation (a fresh snapshot) begins.
    pub snapshot_interval: Duration,
    /// How far back a restore can go: older generations are deleted once a newer one covers
    /// the window.
    pub retention: Duration,
    /// WAL frames after which the replica checkpoints (SQLite's own default is 1000).
    pub checkpoint_frames: u64,
    /// Shipped-but-not-uploaded bytes held before the chain is given up.
    pub pending_bytes_max: usize,
}

/// What the replica has done (the server's `/metrics` reads it).
#[derive(Debug, Default)]
pub struct Status {
    pub generation: Mutex<String>,
    /// When the newest uploaded segment (or snapshot) was read: everything committed before
    /// it is in the replica.
    pub replicated_through_ms: AtomicI64,
    pub segments: AtomicU64,
    pub bytes: AtomicU64,
    pub generations: AtomicU64,
    pub failures: AtomicU64,
    pub pending_bytes: AtomicU64,
}

/// The longest wait between rounds while they fail.
const FAILING_WAIT_MAX: Duration = Duration::from_secs(30);

/// The running replica; [`finish`](Self::finish) ships what is left when the server stops.
pub struct Replica {
    pub status: Arc<Status>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    /// Ships what was committed up to now and stops.
    pub async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Starts replicating the store's database: checkpoints are taken over first (the writer's
/// automatic ones stop), then the first generation begins.
pub async fn start(replication: SqliteReplication, settings: Settings, sources: Sources) -> Result<Replica> {
    replication
        .take_over_checkpoints()
        .await
        .map_err(|e| Error::Database(e.to_string()))?;
    let conn = open_connection(replication.path())?;
    let status = Arc::new(Status::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wal_path = wal_path(replication.path());
    let mut replicator = Replicator {
        replication,
        settings,
        sources,
        status: status.clone(),
        conn: Arc::new(Mutex::new(conn)),
        wal_path,
        generation: None,
        position: Wal::Unwritten,
        backfilled: None,
        pending: VecDeque::new(),
        failing_since: None,
    };
    let task = tokio::spawn(async move { replicator.run(stopped).await });
    Ok(Replica { status, stop, task })
}

pub fn wal_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

fn open_connection(path: &Path) -> Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path).map_err(|e| Error::Database(format!("open {}: {e}", path.display())))?;
    // A checkpoint waits this long for readers; the writer is parked meanwhile, so keep it short
    // and try again at the next tick.
    conn.busy_timeout(Duration::from_millis(250))
        .map_err(|e| Error::Database(e.to_string()))?;
    Ok(conn)
}

/// Where the replica stands in the WAL.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wal {
    /// There was no log when the generation began: the first header written begins it.
    Unwritten,
    At(Position),
}

struct Generation {
    id: String,
    started_at: Millis,
    next_sequence: u64,
}

struct Segment {
    key: String,
    bytes: Vec<u8>,
    read_at: Millis,
}

struct Replicator {
    replication: SqliteReplication,
    settings: Settings,
    sources: Sources,
    status: Arc<Status>,
    /// Kept open for the process's life: the replica's checkpoints run on it, and while it is
    /// open no other connection's close is the last one (which would checkpoint on its own).
    conn: Arc<Mutex<rusqlite::Connection>>,
    wal_path: PathBuf,
    generation: Option<Generation>,
    position: Wal,
    /// A position up to which a checkpoint of the replica's moved every frame into the
    /// database file: SQLite may restart the log from there, and the chain holds.
    backfilled: Option<Position>,
    pending: VecDeque<Segment>,
    failing_since: Option<Millis>,
}

/// What a checkpoint came to.
struct Checkpointed {
    /// Every frame of the log moved into the database file.
    complete: bool,
    /// Frames in the log.
    log: i64,
}

impl Replicator {
    async fn run(&mut self, mut stopped: tokio::sync::watch::Receiver<bool>) {
        let mut wait = self.settings.interval;
        loop {
            let stopping = tokio::select! {
                _ = tokio::time::sleep(wait) => false,
                _ = stopped.changed() => true,
            };
            // Read before the step: a stop asked during it is seen by the next `changed`, so
            // the last step always begins after the stop was asked.
            let stopping = stopping || *stopped.borrow();
            if let Err(error) = self.step().await {
                self.status.failures.fetch_add(1, Ordering::Relaxed);
                let now = self.sources.now_ms();
                if self.failing_since.is_none() {
                    self.failing_since = Some(now);
                    tracing::error!(%error, target = %self.settings.target.shown, "the replica could not ship; it keeps trying");
                }
                // Each failed round (a snapshot compressed and refused, a checkpoint kept from
                // completing) waits longer before the next, up to `FAILING_WAIT_MAX`; every
                // round checkpoints first, so the WAL stays bounded meanwhile.
                wait = (wait * 2).min(FAILING_WAIT_MAX.max(self.settings.interval));
            } else {
                wait = self.settings.interval;
                if let Some(since) = self.failing_since.take() {
                    tracing::info!(after_ms = self.sources.now_ms() - since, "the replica ships again");
                }
            }
            if stopping {
                tracing::info!(generation = %self.status.generation.lock().expect("status").clone(), pending = self.pending.len(), "the replica stopped");
                return;
            }
        }
    }

    async fn step(&mut self) -> Result<()> {
        if self.generation.is_none() {
            self.begin_generation().await?;
        }
        self.ship().await?;
        let due_snapshot = self
            .generation
            .as_ref()
            .is_some_and(|g| self.sources.now_ms() - g.started_at >= self.settings.snapshot_interval.as_millis() as Millis);
        let long_log = matches!(self.position, Wal::At(p) if p.frames() >= self.settings.checkpoint_frames);
        if long_log || due_snapshot {
            self.checkpoint().await?;
        }
        self.upload().await?;
        if due_snapshot && self.pending.is_empty() {
            self.generation = None;
        }
        Ok(())
    }

    /// Reads what was committed since the last look into a pending segment.
    async fn ship(&mut self) -> Result<()> {
        let (frames, read_at) = self.read_new().await?;
        self.push(frames, read_at);
        Ok(())
    }

    async fn read_new(&mut self) -> Result<(Vec<wal::Frame>, Millis)> {
        let path = self.wal_path.clone();
        let (position, backfilled) = (self.position, self.backfilled);
        let read_at = self.sources.now_ms();
        let read = tokio::task::spawn_blocking(move || read_since(&path, position, backfilled))
            .await
            .map_err(|e| Error::Io(e.to_string()))??;
        match read {
            Read::Continued(frames, position) => {
                self.position = position;
                Ok((frames, read_at))
            }
            Read::Broken(why) => {
                tracing::warn!(why, "the replica lost the WAL's chain; a new generation begins");
                self.abandon_generation();
                Err(Error::Chain(why))
            }
        }
    }

    fn push(&mut self, frames: Vec<wal::Frame>, read_at: Millis) {
        let Some(generation) = self.generation.as_mut() else { return };
        if frames.is_empty() {
            if self.pending.is_empty() {
                // Nothing new and nothing waiting: the replica holds all committed by then.
                self.status.replicated_through_ms.fetch_max(read_at, Ordering::Relaxed);
            }
            return;
        }
        let bytes = lz4_flex::compress_prepend_size(&wal::encode(&frames));
        let key = layout::segment(&generation.id, generation.next_sequence, read_at);
        generation.next_sequence += 1;
        self.pending.push_back(Segment { key, bytes, read_at });
        self.note_pending();
    }

    fn note_pending(&self) {
        let bytes: usize = self.pending.iter().map(|s| s.bytes.len()).sum();
        self.status.pending_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    /// Uploads pending segments in order; past the bound, the chain is given up.
    async fn upload(&mut self) -> Result<()> {
        while let Some(segment) = self.pending.front() {
            if let Err(error) = self.settings.target.put(&segment.key, segment.bytes.clone()).await {
                let held: usize = self.pending.iter().map(|s| s.bytes.len()).sum();
                if held > self.settings.pending_bytes_max {
                    tracing::error!(
                        held,
                        "the replica's target has been unreachable past its bound; a new generation begins when it answers"
                    );
                    self.abandon_generation();
                }
                return Err(error);
            }
            let segment = self.pending.pop_front().expect("front");
            self.status.segments.fetch_add(1, Ordering::Relaxed);
            self.status.bytes.fetch_add(segment.bytes.len() as u64, Ordering::Relaxed);
            self.status.replicated_through_ms.fetch_max(segment.read_at, Ordering::Relaxed);
            self.note_pending();
        }
        Ok(())
    }

    fn abandon_generation(&mut self) {
        self.generation = None;
        self.pending.clear();
        self.note_pending();
    }

    /// With the writer parked: ships the log's tail, then checkpoints it. A checkpoint that
    /// moved every frame lets SQLite restart the log at the next write, which the chain then
    /// follows (see [`read_since`]).
    async fn checkpoint(&mut self) -> Result<()> {
        let paused = self.replication.pause_writes().await;
        let (frames, read_at) = self.read_new().await?;
        self.push(frames, read_at);
        let done = self.checkpoint_full().await?;
        drop(paused);
        if let Wal::At(position) = self.position {
            if done.complete && done.log as u64 == position.frames() {
                self.backfilled = Some(position);
            }
        }
        Ok(())
    }

    async fn checkpoint_full(&self) -> Result<Checkpointed> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || checkpoint_full(&conn.lock().expect("replica connection")))
            .await
            .map_err(|e| Error::Io(e.to_string()))?
    }

    /// A snapshot of the database file after a checkpoint moved every committed frame into
    /// it, and a new generation from there.
    async fn begin_generation(&mut self) -> Result<()> {
        let paused = self.replication.pause_writes().await;
        let path = self.wal_path.clone();
        let position = tokio::task::spawn_blocking(move || end_of_log(&path))
            .await
            .map_err(|e| Error::Io(e.to_string()))??;
        let done = self.checkpoint_full().await?;
        drop(paused);
        let whole = match position {
            Wal::At(at) => done.complete && done.log as u64 == at.frames(),
            Wal::Unwritten => done.complete,
        };
        if !whole {
            return Err(Error::Database(
                "readers kept the WAL from being checkpointed for a snapshot; trying again".into(),
            ));
        }
        // The database file changes only at a checkpoint, and only this replica checkpoints:
        // it holds the checkpointed state while it is copied, however many transactions the
        // WAL takes meanwhile.
        self.position = position;
        self.backfilled = match position {
            Wal::At(at) => Some(at),
            Wal::Unwritten => None,
        };
        let started_at = self.sources.now_ms();
        let id = self.sources.new_ulid().to_string();
        let database = self.replication.path().to_path_buf();
        let staged = staging_path(&database);
        let (page_size, snapshot_bytes) = {
            let (database, staged) = (database.clone(), staged.clone());
            tokio::task::spawn_blocking(move || compress_file(&database, &staged))
                .await
                .map_err(|e| Error::Io(e.to_string()))??
        };
        let target = &self.settings.target;
        let uploaded = target.put_file(&layout::snapshot(&id), &staged).await;
        let _ = std::fs::remove_file(&staged);
        uploaded?;
        let manifest = Manifest {
            format: layout::FORMAT,
            page_size,
            started_at_ms: started_at,
            snapshot_bytes,
        };
        target
            .put(&layout::manifest(&id), serde_json::to_vec_pretty(&manifest).expect("manifest"))
            .await?;
        tracing::info!(generation = %id, snapshot_bytes, "the replica began a generation");
        *self.status.generation.lock().expect("status") = id.clone();
        self.status.generations.fetch_add(1, Ordering::Relaxed);
        self.status.replicated_through_ms.fetch_max(started_at, Ordering::Relaxed);
        self.generation = Some(Generation {
            id,
            started_at,
            next_sequence: 0,
        });
        if let Err(error) = self.expire().await {
            tracing::warn!(%error, "the replica could not delete expired generations");
        }
        Ok(())
    }

    /// Deletes each generation whose successor began before the retention window: every
    /// point in the window is restorable from a newer one.
    async fn expire(&self) -> Result<()> {
        let generations = crate::restore::generations(&self.settings.target).await?;
        let horizon = self.sources.now_ms() - self.settings.retention.as_millis() as Millis;
        for pair in generations.windows(2) {
            if pair[1].manifest.started_at_ms < horizon {
                for key in self
                    .settings
                    .target
                    .list(&format!("{}/{}", layout::GENERATIONS, pair[0].id))
                    .await?
                {
                    self.settings.target.delete(&key).await?;
                }
                tracing::info!(generation = %pair[0].id, "the replica deleted an expired generation");
            }
        }
        Ok(())
    }
}

enum Read {
    Continued(Vec<wal::Frame>, Wal),
    Broken(String),
}

/// The committed frames after `position`, following the log across a restart only where the
/// replica's own checkpoint had moved every frame it had copied.
fn read_since(path: &Path, position: Wal, backfilled: Option<Position>) -> Result<Read> {
    let Some(header) = wal::read_header(path).map_err(io(path))? else {
        return Ok(Read::Continued(Vec::new(), position));
    };
    let from = match position {
        Wal::At(at) if at.header == header => at,
        Wal::Unwritten => Position::start(header),
        Wal::At(at) => {
            // Every restart adds one to the first salt (whichever connection restarts), so one
            // restart from where the replica's checkpoint moved everything loses nothing; any
            // other change of log might have.
            let continuous = backfilled == Some(at) && header.salts.0 == at.header.salts.0.wrapping_add(1);
            if !continuous {
                return Ok(Read::Broken(format!(
                    "the WAL restarted (salt {} → {}) under frames the replica may not have copied",
                    at.header.salts.0, header.salts.0
                )));
            }
            Position::start(header)
        }
    };
    let (frames, after) = wal::read_committed(path, from).map_err(io(path))?;
    Ok(Read::Continued(frames, Wal::At(after)))
}

/// `PRAGMA wal_checkpoint(FULL)`: every frame into the database file, unless a reader holds
/// an old snapshot past the busy timeout. The log is not restarted here (SQLite restarts it
/// at the next write, adding one to its first salt).
fn checkpoint_full(conn: &rusqlite::Connection) -> Result<Checkpointed> {
    let (busy, log, moved): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(FULL)", [], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .map_err(|e| Error::Database(format!("checkpoint: {e}")))?;
    Ok(Checkpointed {
        complete: busy == 0 && log == moved,
        log,
    })
}

/// The end of the log's committed frames as it is now, whatever the replica read before.
fn end_of_log(path: &Path) -> Result<Wal> {
    let Some(header) = wal::read_header(path).map_err(io(path))? else {
        return Ok(Wal::Unwritten);
    };
    let (_, end) = wal::read_committed(path, Position::start(header)).map_err(io(path))?;
    Ok(Wal::At(end))
}

pub(crate) fn staging_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_os_string();
    name.push(".replica-snapshot");
    PathBuf::from(name)
}

/// Compresses the file at `from` into `to`; its page size (from the database header) and
/// length.
pub(crate) fn compress_file(from: &Path, to: &Path) -> Result<(u32, u64)> {
    use std::io::{Read, Write};
    let mut source = std::fs::File::open(from).map_err(io(from))?;
    let mut header = [0u8; 100];
    source.read_exact(&mut header).map_err(io(from))?;
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536,
        size => size as u32,
    };
    let sink = std::fs::File::create(to).map_err(io(to))?;
    let mut encoder = lz4_flex::frame::FrameEncoder::new(std::io::BufWriter::new(sink));
    encoder.write_all(&header).map_err(io(to))?;
    let copied = std::io::copy(&mut source, &mut encoder).map_err(io(from))? + header.len() as u64;
    let mut sink = encoder.finish().map_err(|e| Error::Io(format!("{}: {e}", to.display())))?;
    sink.flush().map_err(io(to))?;
    Ok((page_size, copied))
}
