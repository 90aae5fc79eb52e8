//! Power cuts for the simulated server's SQLite file.
//!
//! A process crash keeps what the operating system has buffered; a power cut loses every write
//! that was not fsynced. The simulator opens its store through a VFS shim (`capstan-power`) over
//! SQLite's default VFS: every write and truncation passes through to the file, and the shim
//! keeps, per file, what the bytes were before each change since the file's last `xSync`. A
//! power cut is then [`durable_image`]: each file as a disk would hold it after the cut — its
//! bytes with the unsynced changes undone, cut to its length at the last sync — written into a
//! fresh directory, where the simulated server comes back. (Shared-memory `-shm` files are
//! left behind: SQLite rebuilds them from the WAL.) Whatever was acknowledged must be there.
//!
//! A cut can also land inside a commit: [`arm_cut`] makes the next `xSync` of a file on a disk
//! take that disk's image there, just before the sync reaches the disk or just after, while the
//! server goes on unaware; the simulator then drops the step's answer (nobody heard it) and
//! brings the server back on the image ([`fired_cut`]).

use rusqlite::ffi;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::{Mutex, Once};

/// The shim's VFS name, for `SqliteStore::open_with_vfs`.
pub(crate) const VFS_NAME: &str = "capstan-power";
const VFS_NAME_C: &CStr = c"capstan-power";

/// What a file's unsynced changes undo to: its length at the last sync and, newest last, the
/// bytes each change overwrote.
#[derive(Default)]
struct Unsynced {
    synced_len: Option<i64>,
    undo: Vec<(i64, Vec<u8>)>,
}

/// Per file path (as SQLite names it), since its last sync.
static UNSYNCED: Mutex<BTreeMap<String, Unsynced>> = Mutex::new(BTreeMap::new());

/// A power cut waiting for the next sync on one disk.
struct ArmedCut {
    /// Where the image goes.
    to: std::path::PathBuf,
    /// Whether the sync in progress reaches the disk before the power fails.
    after_sync: bool,
    /// Set once the cut happened: the image's unsynced writes undone, or why it failed.
    fired: Option<std::io::Result<usize>>,
}

/// Per disk directory (several simulations may run in one process).
static ARMED: Mutex<BTreeMap<std::path::PathBuf, ArmedCut>> = Mutex::new(BTreeMap::new());

/// Makes the power fail at the next sync of a file under `disk`; its image goes to `to`.
pub(crate) fn arm_cut(disk: &Path, to: &Path, after_sync: bool) {
    let cut = ArmedCut {
        to: to.to_path_buf(),
        after_sync,
        fired: None,
    };
    ARMED.lock().unwrap_or_else(|e| e.into_inner()).insert(disk.to_path_buf(), cut);
}

/// Disarms the cut on `disk`; returns what it did if it happened.
pub(crate) fn fired_cut(disk: &Path) -> Option<std::io::Result<usize>> {
    ARMED.lock().unwrap_or_else(|e| e.into_inner()).remove(disk)?.fired
}

/// Takes the image of the disk holding `file` if a cut is armed there and has not fired.
fn cut_if_armed(file: &str, after_sync: bool) {
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let Some((disk, cut)) = armed.iter_mut().find(|(disk, _)| Path::new(file).starts_with(disk)) else {
        return;
    };
    if cut.fired.is_none() && cut.after_sync == after_sync {
        cut.fired = Some(durable_image(disk, &cut.to));
    }
}

/// A file opened through the shim: SQLite's handle first, then the default VFS's file.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// The path (a leaked `Box<String>`, freed on close), or null for a temporary file.
    path: *mut String,
}

static REGISTERED: Once = Once::new();

/// Registers the shim (once per process) over SQLite's default VFS.
pub(crate) fn register() {
    REGISTERED.call_once(|| {
        // SAFETY: SQLite's default VFS lives for the process; the shim is a copy of it with
        // open, delete and the file size changed, leaked so that it lives as long.
        unsafe {
            let default = ffi::sqlite3_vfs_find(std::ptr::null());
            assert!(!default.is_null(), "SQLite has a default VFS");
            let mut vfs: ffi::sqlite3_vfs = std::ptr::read(default);
            vfs.pNext = std::ptr::null_mut();
            vfs.zName = VFS_NAME_C.as_ptr();
            vfs.pAppData = default.cast();
            vfs.szOsFile = std::mem::size_of::<ShimFile>() as c_int + (*default).szOsFile;
            vfs.xOpen = Some(shim_open);
            vfs.xDelete = Some(shim_delete);
            let vfs = Box::into_raw(Box::new(vfs));
            let rc = ffi::sqlite3_vfs_register(vfs, 0);
            assert_eq!(rc, ffi::SQLITE_OK, "registering the power-cut VFS");
        }
    });
}

/// Writes into `to` every file of `from` as a disk would hold it after a power cut now.
pub(crate) fn durable_image(from: &Path, to: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(to)?;
    let unsynced = UNSYNCED.lock().unwrap_or_else(|e| e.into_inner());
    let mut undone = 0;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if !entry.file_type()?.is_file() || name.to_string_lossy().ends_with("-shm") {
            continue;
        }
        let mut bytes = std::fs::read(entry.path())?;
        if let Some(changes) = unsynced.get(entry.path().to_string_lossy().as_ref()) {
            for (offset, old) in changes.undo.iter().rev() {
                let (start, end) = (*offset as usize, *offset as usize + old.len());
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[start..end].copy_from_slice(old);
            }
            if let Some(len) = changes.synced_len {
                bytes.resize(len as usize, 0);
            }
            undone += changes.undo.len();
        }
        std::fs::write(to.join(&name), bytes)?;
    }
    Ok(undone)
}

/// Drops what the shim remembers of the files under `dir` (a disk no longer in use).
pub(crate) fn forget(dir: &Path) {
    let prefix = dir.to_string_lossy().into_owned();
    UNSYNCED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|path, _| !path.starts_with(&prefix));
}

// -- the VFS ---------------------------------------------------------------------------------

unsafe fn default_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    (*vfs).pAppData.cast()
}

unsafe extern "C" fn shim_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let default = default_vfs(vfs);
    let shim = file.cast::<ShimFile>();
    let real = file.cast::<u8>().add(std::mem::size_of::<ShimFile>()).cast::<ffi::sqlite3_file>();
    (*shim).base.pMethods = std::ptr::null();
    let rc = ((*default).xOpen.expect("xOpen"))(default, name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (*shim).real = real;
    (*shim).path = if name.is_null() {
        std::ptr::null_mut()
    } else {
        Box::into_raw(Box::new(CStr::from_ptr(name).to_string_lossy().into_owned()))
    };
    (*shim).base.pMethods = &METHODS;
    rc
}

unsafe extern "C" fn shim_delete(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
    let default = default_vfs(vfs);
    let rc = ((*default).xDelete.expect("xDelete"))(default, name, sync_dir);
    if rc == ffi::SQLITE_OK && !name.is_null() {
        let path = CStr::from_ptr(name).to_string_lossy().into_owned();
        UNSYNCED.lock().unwrap_or_else(|e| e.into_inner()).remove(&path);
    }
    rc
}

unsafe fn real(file: *mut ffi::sqlite3_file) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let real = (*file.cast::<ShimFile>()).real;
    (real, &*(*real).pMethods)
}

unsafe fn path(file: *mut ffi::sqlite3_file) -> Option<&'static String> {
    (*file.cast::<ShimFile>()).path.as_ref()
}

unsafe fn size_of_file(real: *mut ffi::sqlite3_file, methods: &ffi::sqlite3_io_methods) -> Option<i64> {
    let mut size: ffi::sqlite3_int64 = 0;
    (methods.xFileSize.expect("xFileSize")(real, &mut size) == ffi::SQLITE_OK).then_some(size)
}

/// Records what `[offset, offset + len)` holds now (within the file), before it changes.
unsafe fn remember(file: *mut ffi::sqlite3_file, offset: i64, len: i64) {
    let Some(path) = path(file) else { return };
    let (real, methods) = real(file);
    let Some(size) = size_of_file(real, methods) else { return };
    let mut unsynced = UNSYNCED.lock().unwrap_or_else(|e| e.into_inner());
    let changes = unsynced.entry(path.clone()).or_default();
    changes.synced_len.get_or_insert(size);
    // What the write overwrites within the file; an append overwrites nothing (the synced
    // length undoes it) but is kept too, so that every lost write is counted.
    let end = (offset + len).min(size).max(offset);
    let mut old = vec![0u8; (end - offset) as usize];
    if !old.is_empty() {
        methods.xRead.expect("xRead")(real, old.as_mut_ptr().cast(), old.len() as c_int, offset);
    }
    changes.undo.push((offset, old));
}

unsafe extern "C" fn shim_close(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, methods) = real(file);
    let rc = methods.xClose.expect("xClose")(real);
    let shim = file.cast::<ShimFile>();
    if !(*shim).path.is_null() {
        drop(Box::from_raw((*shim).path));
        (*shim).path = std::ptr::null_mut();
    }
    rc
}

unsafe extern "C" fn shim_write(file: *mut ffi::sqlite3_file, buf: *const c_void, amount: c_int, offset: i64) -> c_int {
    remember(file, offset, amount as i64);
    let (real, methods) = real(file);
    methods.xWrite.expect("xWrite")(real, buf, amount, offset)
}

unsafe extern "C" fn shim_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let (real, methods) = real(file);
    if let Some(current) = size_of_file(real, methods) {
        remember(file, size, current - size);
    }
    methods.xTruncate.expect("xTruncate")(real, size)
}

unsafe extern "C" fn shim_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let (real, methods) = real(file);
    if let Some(path) = path(file) {
        cut_if_armed(path, false);
    }
    let rc = methods.xSync.expect("xSync")(real, flags);
    if rc == ffi::SQLITE_OK {
        if let Some(path) = path(file) {
            UNSYNCED.lock().unwrap_or_else(|e| e.into_inner()).remove(path);
            cut_if_armed(path, true);
        }
    }
    rc
}

// The rest pass straight through to the default VFS's file.

unsafe extern "C" fn shim_read(file: *mut ffi::sqlite3_file, buf: *mut c_void, amount: c_int, offset: i64) -> c_int {
    let (real, methods) = real(file);
    methods.xRead.expect("xRead")(real, buf, amount, offset)
}

unsafe extern "C" fn shim_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let (real, methods) = real(file);
    methods.xFileSize.expect("xFileSize")(real, size)
}

unsafe extern "C" fn shim_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, methods) = real(file);
    methods.xLock.expect("xLock")(real, level)
}

unsafe extern "C" fn shim_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, methods) = real(file);
    methods.xUnlock.expect("xUnlock")(real, level)
}

unsafe extern "C" fn shim_check_reserved(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let (real, methods) = real(file);
    methods.xCheckReservedLock.expect("xCheckReservedLock")(real, out)
}

unsafe extern "C" fn shim_file_control(file: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    let (real, methods) = real(file);
    methods.xFileControl.expect("xFileControl")(real, op, arg)
}

unsafe extern "C" fn shim_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, methods) = real(file);
    methods.xSectorSize.expect("xSectorSize")(real)
}

unsafe extern "C" fn shim_device(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, methods) = real(file);
    methods.xDeviceCharacteristics.expect("xDeviceCharacteristics")(real)
}

unsafe extern "C" fn shim_shm_map(file: *mut ffi::sqlite3_file, page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int {
    let (real, methods) = real(file);
    methods.xShmMap.expect("xShmMap")(real, page, size, extend, out)
}

unsafe extern "C" fn shim_shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
    let (real, methods) = real(file);
    methods.xShmLock.expect("xShmLock")(real, offset, n, flags)
}

unsafe extern "C" fn shim_shm_barrier(file: *mut ffi::sqlite3_file) {
    let (real, methods) = real(file);
    methods.xShmBarrier.expect("xShmBarrier")(real)
}

unsafe extern "C" fn shim_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let (real, methods) = real(file);
    methods.xShmUnmap.expect("xShmUnmap")(real, delete)
}

unsafe extern "C" fn shim_fetch(file: *mut ffi::sqlite3_file, offset: i64, amount: c_int, out: *mut *mut c_void) -> c_int {
    // No memory-mapped reads: every read goes through xRead (the simulator's files are small).
    let _ = (file, offset, amount);
    *out = std::ptr::null_mut();
    ffi::SQLITE_OK
}

unsafe extern "C" fn shim_unfetch(file: *mut ffi::sqlite3_file, offset: i64, page: *mut c_void) -> c_int {
    let _ = (file, offset, page);
    ffi::SQLITE_OK
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(shim_close),
    xRead: Some(shim_read),
    xWrite: Some(shim_write),
    xTruncate: Some(shim_truncate),
    xSync: Some(shim_sync),
    xFileSize: Some(shim_file_size),
    xLock: Some(shim_lock),
    xUnlock: Some(shim_unlock),
    xCheckReservedLock: Some(shim_check_reserved),
    xFileControl: Some(shim_file_control),
    xSectorSize: Some(shim_sector_size),
    xDeviceCharacteristics: Some(shim_device),
    xShmMap: Some(shim_shm_map),
    xShmLock: Some(shim_shm_lock),
    xShmBarrier: Some(shim_shm_barrier),
    xShmUnmap: Some(shim_shm_unmap),
    xFetch: Some(shim_fetch),
    xUnfetch: Some(shim_unfetch),
};
