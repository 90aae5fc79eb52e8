//! Restoring a replica: the newest generation that began at or before the wanted time, its
//! snapshot, then its segments shipped up to that time, applied in order one whole transaction
//! at a time (a WAL frame is a page image: applying a transaction writes its pages and sets the
//! file's length to its commit's size). The result is checked by SQLite's integrity check
//! before it is handed over.

use crate::layout::{self, Manifest};
use crate::target::Target;
use crate::wal;
use crate::{io, Error, Result};
use capstan_engine::Millis;
use serde::Serialize;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// A complete generation of a replica.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationInfo {
    pub id: String,
    pub manifest: Manifest,
    /// Its segments: (sequence, shipped at), in order.
    #[serde(skip)]
    pub segments: Vec<(u64, Millis)>,
    /// The newest point a restore from it reaches.
    pub last_shipped_at_ms: Millis,
}

/// What a restore came to.
#[derive(Debug, Serialize)]
pub struct Restored {
    pub generation: String,
    /// Every transaction committed before this time (as the replica read them) is restored.
    pub restored_through_ms: Millis,
    pub segments: usize,
    pub transactions: usize,
}

/// The replica's complete generations, oldest first.
pub async fn generations(target: &Target) -> Result<Vec<GenerationInfo>> {
    let keys = target.list(layout::GENERATIONS).await?;
    let mut ids: Vec<&str> = keys
        .iter()
        .filter(|k| k.ends_with("/manifest.json"))
        .filter_map(|k| layout::generation_of(k))
        .collect();
    ids.dedup();
    let mut found = Vec::new();
    for id in ids {
        let manifest: Manifest = serde_json::from_slice(&target.get(&layout::manifest(id)).await?)
            .map_err(|e| Error::Corrupt(format!("generation {id}: manifest: {e}")))?;
        if manifest.format != layout::FORMAT {
            return Err(Error::Corrupt(format!(
                "generation {id}: layout version {} (this Capstan reads {})",
                manifest.format,
                layout::FORMAT
            )));
        }
        let prefix = format!("{}/", layout::segments(id));
        let mut segments: Vec<(u64, Millis)> = keys
            .iter()
            .filter(|k| k.starts_with(&prefix))
            .filter_map(|k| layout::parse_segment(k))
            .collect();
        segments.sort();
        let last_shipped_at_ms = segments.last().map_or(manifest.started_at_ms, |s| s.1);
        found.push(GenerationInfo {
            id: id.to_string(),
            manifest,
            segments,
            last_shipped_at_ms,
        });
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// Restores the replica into a new database file at `into` as of `at` (the newest point when
/// `None`).
pub async fn restore(target: &Target, into: &Path, at: Option<Millis>) -> Result<Restored> {
    if into.exists() {
        return Err(Error::Config(format!(
            "{} already exists; restore into a new data directory",
            into.display()
        )));
    }
    let generations = generations(target).await?;
    let chosen = generations
        .iter()
        .rev()
        .find(|g| at.is_none_or(|at| g.manifest.started_at_ms <= at))
        .ok_or_else(|| match (generations.first(), at) {
            (None, _) => Error::Config(format!("{}: no complete generation to restore", target.shown)),
            (Some(oldest), Some(at)) => Error::Config(format!(
                "{}: nothing retained at {at} ms; the oldest generation began at {} ms",
                target.shown, oldest.manifest.started_at_ms
            )),
            (Some(_), None) => unreachable!("a generation is found when no time is asked"),
        })?;
    let partial = partial_path(into);
    let applied = apply(target, chosen, &partial, at).await.and_then(|restored| {
        check_integrity(&partial)?;
        Ok(restored)
    });
    let restored = match applied {
        Ok(restored) => restored,
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
    };
    std::fs::rename(&partial, into).map_err(io(into))?;
    Ok(restored)
}

/// The generation's snapshot and its segments up to `at`, written into `partial`.
async fn apply(target: &Target, chosen: &GenerationInfo, partial: &Path, at: Option<Millis>) -> Result<Restored> {
    let snapshot = target.get(&layout::snapshot(&chosen.id)).await?;
    let page_size = chosen.manifest.page_size as usize;
    let mut restored = Restored {
        generation: chosen.id.clone(),
        restored_through_ms: chosen.manifest.started_at_ms,
        segments: 0,
        transactions: 0,
    };
    {
        let mut file = std::fs::File::create(partial).map_err(io(partial))?;
        let mut decoder = lz4_flex::frame::FrameDecoder::new(snapshot.as_slice());
        std::io::copy(&mut decoder, &mut file).map_err(|e| Error::Corrupt(format!("generation {}: snapshot: {e}", chosen.id)))?;
        let mut applier = Applier::new(file, page_size);
        for (expected, &(sequence, shipped_at)) in chosen.segments.iter().enumerate() {
            if at.is_some_and(|at| shipped_at > at) {
                break;
            }
            if sequence != expected as u64 {
                return Err(Error::Corrupt(format!("generation {}: segment {expected} is missing", chosen.id)));
            }
            let compressed = target.get(&layout::segment(&chosen.id, sequence, shipped_at)).await?;
            let frames = lz4_flex::decompress_size_prepended(&compressed)
                .ok()
                .and_then(|bytes| wal::decode(&bytes, page_size))
                .ok_or_else(|| Error::Corrupt(format!("generation {}: segment {sequence} does not decode", chosen.id)))?;
            restored.transactions += applier.apply(&frames).map_err(io(partial))?;
            restored.segments += 1;
            restored.restored_through_ms = shipped_at;
        }
        applier.finish().map_err(io(partial))?;
    }
    Ok(restored)
}

fn partial_path(into: &Path) -> std::path::PathBuf {
    let mut name = into.as_os_str().to_os_string();
    name.push(".restoring");
    std::path::PathBuf::from(name)
}

/// Writes whole transactions' pages into a database file.
struct Applier {
    file: std::fs::File,
    page_size: usize,
    /// The size in pages after the last applied commit.
    pages: Option<u32>,
}

impl Applier {
    fn new(file: std::fs::File, page_size: usize) -> Self {
        Self {
            file,
            page_size,
            pages: None,
        }
    }

    /// Applies the frames (whole transactions: a segment never ends inside one); how many
    /// transactions they held.
    fn apply(&mut self, frames: &[wal::Frame]) -> std::io::Result<usize> {
        let mut transactions = 0;
        for frame in frames {
            if frame.page == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a frame names page 0"));
            }
            self.file.seek(SeekFrom::Start((frame.page as u64 - 1) * self.page_size as u64))?;
            self.file.write_all(&frame.data)?;
            if let Some(size) = frame.commit_size {
                self.pages = Some(size);
                transactions += 1;
            }
        }
        Ok(transactions)
    }

    fn finish(self) -> std::io::Result<()> {
        if let Some(pages) = self.pages {
            self.file.set_len(pages as u64 * self.page_size as u64)?;
        }
        self.file.sync_all()
    }
}

/// SQLite's own integrity check on the restored file.
pub fn check_integrity(path: &Path) -> Result<()> {
    let conn = rusqlite::Connection::open(path).map_err(|e| Error::Database(format!("open {}: {e}", path.display())))?;
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|e| Error::Database(format!("integrity check of {}: {e}", path.display())))?;
    if verdict != "ok" {
        return Err(Error::Corrupt(format!("{}: SQLite's integrity check: {verdict}", path.display())));
    }
    Ok(())
}
