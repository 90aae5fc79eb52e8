//! Reading SQLite's write-ahead log (https://sqlite.org/fileformat2.html#walformat): the
//! committed transactions appended since a known position, each frame checked against the
//! WAL's salts and its cumulative checksum exactly as SQLite's own recovery checks them. A
//! frame that fails either (torn, left over from before a restart, of a transaction still
//! being written) ends what is read; nothing past the last commit frame is returned.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

pub const HEADER_BYTES: u64 = 32;
pub const FRAME_HEADER_BYTES: usize = 24;
const MAGIC_LITTLE_ENDIAN: u32 = 0x377f_0682;
const MAGIC_BIG_ENDIAN: u32 = 0x377f_0683;

/// A WAL's header: which log this is (its salts change at every restart) and how it is summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub page_size: u32,
    pub checkpoint_sequence: u32,
    pub salts: (u32, u32),
    big_endian_sums: bool,
    /// The checksum of the header, where the first frame's sum starts.
    sums: (u32, u32),
}

/// Where reading stopped: the offset of the next frame and the running checksum there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub header: Header,
    pub offset: u64,
    sums: (u32, u32),
}

impl Position {
    /// Just after the header: no frame read yet.
    pub fn start(header: Header) -> Self {
        Self {
            header,
            offset: HEADER_BYTES,
            sums: header.sums,
        }
    }

    /// Frames before this position.
    pub fn frames(&self) -> u64 {
        (self.offset - HEADER_BYTES) / (FRAME_HEADER_BYTES as u64 + self.header.page_size as u64)
    }
}

/// One page image of a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub page: u32,
    /// Set on a transaction's last frame: the database's size in pages after it.
    pub commit_size: Option<u32>,
    pub data: Vec<u8>,
}

/// Reads the header of the WAL at `path`; `None` when the file is missing or has none yet
/// (SQLite truncated it, or no transaction has been written since).
pub fn read_header(path: &Path) -> std::io::Result<Option<Header>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut bytes = [0u8; HEADER_BYTES as usize];
    match file.read_exact(&mut bytes) {
        Ok(()) => Ok(parse_header(&bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(error) => Err(error),
    }
}

fn be(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

/// The header, if its magic, version and checksum are right.
fn parse_header(bytes: &[u8; HEADER_BYTES as usize]) -> Option<Header> {
    let big_endian_sums = match be(bytes, 0) {
        MAGIC_LITTLE_ENDIAN => false,
        MAGIC_BIG_ENDIAN => true,
        _ => return None,
    };
    let page_size = be(bytes, 8);
    if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
        return None;
    }
    let sums = checksum(big_endian_sums, (0, 0), &bytes[..24]);
    if sums != (be(bytes, 24), be(bytes, 28)) {
        return None;
    }
    Some(Header {
        page_size,
        checkpoint_sequence: be(bytes, 12),
        salts: (be(bytes, 16), be(bytes, 20)),
        big_endian_sums,
        sums,
    })
}

/// SQLite's WAL checksum over `data` (a multiple of 8 bytes), continuing from `sums`.
fn checksum(big_endian: bool, sums: (u32, u32), data: &[u8]) -> (u32, u32) {
    let (mut s0, mut s1) = sums;
    for pair in data.chunks_exact(8) {
        let word = |at: usize| {
            let bytes: [u8; 4] = pair[at..at + 4].try_into().expect("four bytes");
            if big_endian {
                u32::from_be_bytes(bytes)
            } else {
                u32::from_le_bytes(bytes)
            }
        };
        s0 = s0.wrapping_add(word(0)).wrapping_add(s1);
        s1 = s1.wrapping_add(word(4)).wrapping_add(s0);
    }
    (s0, s1)
}

/// The committed transactions of the WAL at `path` from `from` on (whose header must still be
/// the file's: the caller compares headers first), and the position after the last of them.
/// Frames after the last commit frame are left for a later read.
pub fn read_committed(path: &Path, from: Position) -> std::io::Result<(Vec<Frame>, Position)> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), from)),
        Err(error) => return Err(error),
    };
    let page_size = from.header.page_size as usize;
    let frame_bytes = FRAME_HEADER_BYTES + page_size;
    let length = file.metadata()?.len();
    let available = length.saturating_sub(from.offset) as usize / frame_bytes * frame_bytes;
    let mut bytes = vec![0u8; available];
    file.seek(SeekFrom::Start(from.offset))?;
    let read = read_up_to(&mut file, &mut bytes)?;
    bytes.truncate(read / frame_bytes * frame_bytes);

    let header = from.header;
    let (mut sums, mut committed, mut frames, mut pending) = (from.sums, from, Vec::new(), Vec::new());
    for (index, raw) in bytes.chunks_exact(frame_bytes).enumerate() {
        let (frame_header, data) = raw.split_at(FRAME_HEADER_BYTES);
        if (be(frame_header, 8), be(frame_header, 12)) != header.salts {
            break;
        }
        sums = checksum(header.big_endian_sums, sums, &frame_header[..8]);
        sums = checksum(header.big_endian_sums, sums, data);
        if sums != (be(frame_header, 16), be(frame_header, 20)) {
            break;
        }
        let commit_size = Some(be(frame_header, 4)).filter(|&size| size != 0);
        pending.push(Frame {
            page: be(frame_header, 0),
            commit_size,
            data: data.to_vec(),
        });
        if commit_size.is_some() {
            frames.append(&mut pending);
            committed = Position {
                header,
                offset: from.offset + ((index + 1) * frame_bytes) as u64,
                sums,
            };
        }
    }
    Ok((frames, committed))
}

/// Reads until `buffer` is full or the file ends; how many bytes were read.
fn read_up_to(file: &mut std::fs::File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Frames as shipped: each a 4-byte page number, a 4-byte commit size (0 inside a
/// transaction) and the page, big-endian, back to back.
pub fn encode(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| 8 + f.data.len()).sum());
    for frame in frames {
        out.extend_from_slice(&frame.page.to_be_bytes());
        out.extend_from_slice(&frame.commit_size.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&frame.data);
    }
    out
}

/// The frames of [`encode`]d bytes with pages of `page_size`; `None` if they do not parse.
pub fn decode(bytes: &[u8], page_size: usize) -> Option<Vec<Frame>> {
    if !bytes.len().is_multiple_of(8 + page_size) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8 + page_size)
            .map(|raw| Frame {
                page: be(raw, 0),
                commit_size: Some(be(raw, 4)).filter(|&size| size != 0),
                data: raw[8..].to_vec(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn database() -> (tempfile::TempDir, Connection, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t (v TEXT);")
            .unwrap();
        let wal = dir.path().join("t.db-wal");
        (dir, conn, wal)
    }

    #[test]
    fn every_committed_transaction_is_read_once_and_a_torn_tail_is_left() {
        let (_dir, conn, wal) = database();
        let header = read_header(&wal).unwrap().expect("a header after the first commit");
        let (first, at) = read_committed(&wal, Position::start(header)).unwrap();
        assert!(first.last().unwrap().commit_size.is_some());
        for i in 0..5 {
            conn.execute("INSERT INTO t VALUES (?1)", [format!("row {i}")]).unwrap();
        }
        let (next, after) = read_committed(&wal, at).unwrap();
        assert_eq!(next.iter().filter(|f| f.commit_size.is_some()).count(), 5, "five commits");
        assert_eq!(after.frames(), at.frames() + next.len() as u64);
        let (nothing, same) = read_committed(&wal, after).unwrap();
        assert!(nothing.is_empty());
        assert_eq!(same, after);

        // A frame whose page was damaged (a torn write) ends the read before it.
        conn.execute("INSERT INTO t VALUES ('torn')", []).unwrap();
        let mut bytes = std::fs::read(&wal).unwrap();
        let at = after.offset as usize + FRAME_HEADER_BYTES + 100;
        bytes[at] ^= 0xff;
        let damaged = wal.with_file_name("damaged-wal");
        std::fs::write(&damaged, &bytes).unwrap();
        let (none, stuck) = read_committed(&damaged, after).unwrap();
        assert!(none.is_empty() && stuck == after);
    }

    #[test]
    fn a_restarted_log_has_new_salts_and_its_old_frames_are_not_read_as_its_own() {
        let (_dir, conn, wal) = database();
        for i in 0..20 {
            conn.execute("INSERT INTO t VALUES (?1)", [format!("row {i}")]).unwrap();
        }
        let before = read_header(&wal).unwrap().unwrap();
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).unwrap();
        conn.execute("INSERT INTO t VALUES ('after')", []).unwrap();
        let after = read_header(&wal).unwrap().unwrap();
        assert_eq!(
            after.salts.0,
            before.salts.0.wrapping_add(1),
            "a restart adds one to the first salt"
        );
        assert_ne!(after.salts.1, before.salts.1);
        let (frames, _) = read_committed(&wal, Position::start(after)).unwrap();
        assert_eq!(frames.iter().filter(|f| f.commit_size.is_some()).count(), 1, "only the new commit");
    }

    #[test]
    fn frames_round_trip_through_their_shipped_form() {
        let frames = vec![
            Frame {
                page: 3,
                commit_size: None,
                data: vec![7; 512],
            },
            Frame {
                page: 1,
                commit_size: Some(9),
                data: vec![1; 512],
            },
        ];
        assert_eq!(decode(&encode(&frames), 512), Some(frames));
        assert_eq!(decode(&[0; 10], 512), None);
    }
}
