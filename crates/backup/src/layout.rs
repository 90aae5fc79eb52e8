//! How a replica is laid out, so that a restore needs nothing but the objects:
//!
//! ```text
//! generations/<ULID>/manifest.json          page size, when the generation began
//! generations/<ULID>/snapshot.lz4           the database file at the generation's start
//! generations/<ULID>/segments/<seq>-<ms>.lz4  committed transactions, in order, shipped at <ms>
//! ```
//!
//! A generation is a snapshot and the unbroken run of transactions after it; a new one starts
//! when the server starts, when the chain could not be kept (the WAL restarted under frames not
//! yet copied, the target unreachable for too long) and every snapshot interval. Generation
//! ids are ULIDs, so their names sort by when they began; the manifest is written last, so a
//! generation without one is incomplete and never restored from.

use capstan_engine::Millis;
use serde::{Deserialize, Serialize};

pub const GENERATIONS: &str = "generations";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// This layout's version.
    pub format: u32,
    pub page_size: u32,
    pub started_at_ms: Millis,
    pub snapshot_bytes: u64,
}

pub const FORMAT: u32 = 1;

pub fn manifest(generation: &str) -> String {
    format!("{GENERATIONS}/{generation}/manifest.json")
}

pub fn snapshot(generation: &str) -> String {
    format!("{GENERATIONS}/{generation}/snapshot.lz4")
}

pub fn segments(generation: &str) -> String {
    format!("{GENERATIONS}/{generation}/segments")
}

pub fn segment(generation: &str, sequence: u64, shipped_at: Millis) -> String {
    format!("{}/{sequence:016x}-{shipped_at:016x}.lz4", segments(generation))
}

/// A segment's sequence number and when it was shipped, from its key.
pub fn parse_segment(key: &str) -> Option<(u64, Millis)> {
    let name = key.rsplit('/').next()?.strip_suffix(".lz4")?;
    let (sequence, shipped) = name.split_once('-')?;
    Some((u64::from_str_radix(sequence, 16).ok()?, i64::from_str_radix(shipped, 16).ok()?))
}

/// The generation a key belongs to.
pub fn generation_of(key: &str) -> Option<&str> {
    key.strip_prefix(GENERATIONS)?.strip_prefix('/')?.split('/').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_sort_by_sequence_and_parse_back() {
        let a = segment("01J", 9, 1_700_000_000_000);
        let b = segment("01J", 10, 1_700_000_000_001);
        assert!(a < b);
        assert_eq!(parse_segment(&b), Some((10, 1_700_000_000_001)));
        assert_eq!(generation_of(&b), Some("01J"));
        assert_eq!(parse_segment("generations/01J/manifest.json"), None);
    }
}
