//! Durable writes (docs/methods.md#writes): every result, checkpoint, shard file, saved
//! session and kernel spec headscope writes goes through [`write_atomic`] or [`commit`], so a
//! reader finds either the old file or the whole new one, whatever stops the writer (kill -9,
//! Ctrl-C, a full disk, a power cut after the call returned).
//!
//! The recipe: write a temporary file beside the target (`.NAME.PID.N.tmp`, unique per process
//! and call, so two processes or threads writing one path never share it), `fsync` it, rename
//! it over the target, `fsync` the directory (the rename itself is then on disk). A failed
//! write removes its temporary file and leaves the target as it was; the error says how many
//! of how many bytes were written. Temporary files of a writer that was killed (its process is
//! gone) are removed by the next write to the same path.
//!
//! A test hook, `HEADSCOPE_WRITE_FAULT`, lets the write tests reach the middle of a write:
//! `slow:MICROS` sleeps between 64 KiB chunks (a kill lands inside the write), and
//! `enospc:N[,M..]` fails the N-th (M-th, ...) chunk written by this process with "no space
//! left on device", as a full disk would.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes written per `write` call (the unit the fault hook counts).
const CHUNK: usize = 64 * 1024;

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);
static CHUNKS_WRITTEN: AtomicU64 = AtomicU64::new(0);

/// The test hook's setting (`HEADSCOPE_WRITE_FAULT`), read at each write.
enum Fault {
    None,
    Slow(std::time::Duration),
    NoSpace(Vec<u64>),
}

fn fault() -> Fault {
    let Ok(v) = std::env::var("HEADSCOPE_WRITE_FAULT") else { return Fault::None };
    if let Some(us) = v.strip_prefix("slow:").and_then(|s| s.parse::<u64>().ok()) {
        return Fault::Slow(std::time::Duration::from_micros(us));
    }
    if let Some(list) = v.strip_prefix("enospc:") {
        return Fault::NoSpace(list.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    }
    Fault::None
}

/// The directory a path's file lives in (`.` for a bare name).
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A fresh temporary name beside `path`: `.NAME.PID.N.tmp`.
pub fn temp_beside(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"))?;
    let n = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    Ok(dir_of(path).join(format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id())))
}

/// Removes the temporary files of writers of `path` whose process is gone (a kill -9 leaves
/// its temporary file behind; the target itself was never touched).
fn remove_stale_temps(path: &Path) {
    let (Some(name), true) = (path.file_name(), Path::new("/proc/self").exists()) else { return };
    let prefix = format!(".{}.", name.to_string_lossy());
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir(dir_of(path)).into_iter().flatten().flatten() {
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)).and_then(|r| r.strip_suffix(".tmp"))
        else {
            continue;
        };
        let Some((pid, seq)) = rest.split_once('.') else { continue };
        let ours = pid == me;
        let numeric =
            !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && seq.bytes().all(|b| b.is_ascii_digit());
        if numeric && !ours && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Syncs a directory, so a rename inside it is on disk.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Makes a finished temporary file the target: `fsync` it, rename it over `path`, `fsync` the
/// directory. On an error the temporary file is removed and `path` is as it was.
pub fn commit(tmp: &Path, path: &Path) -> std::io::Result<()> {
    remove_stale_temps(path);
    let result = (|| {
        std::fs::OpenOptions::new().write(true).open(tmp)?.sync_all()?;
        if let Fault::Slow(d) = fault() {
            std::thread::sleep(d);
        }
        std::fs::rename(tmp, path)?;
        sync_dir(&dir_of(path))
    })();
    if result.is_err() && tmp.exists() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically and durably (the module's recipe). The error of a
/// failed write says how far it got: `No space left on device (os error 28), after 65536 of
/// 1048576 bytes; the previous file is unchanged`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path)?;
    let fault = fault();
    let mut done = 0usize;
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        for chunk in bytes.chunks(CHUNK) {
            let k = CHUNKS_WRITTEN.fetch_add(1, Ordering::Relaxed) + 1;
            match &fault {
                Fault::Slow(d) => std::thread::sleep(*d),
                Fault::NoSpace(at) if at.contains(&k) => {
                    return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
                }
                _ => {}
            }
            f.write_all(chunk)?;
            done += chunk.len();
        }
        Ok(())
    })();
    let result = written.and_then(|()| commit(&tmp, path));
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            let old = if path.exists() { "the previous file is unchanged" } else { "nothing was written" };
            Err(std::io::Error::new(e.kind(), format!("{e}, after {done} of {} bytes; {old}", bytes.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn atomic_write_replaces_whole_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.txt");
        write_atomic(&p, b"first version, long").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(names(dir.path()), ["r.txt"], "temp file left behind");
    }

    #[test]
    fn atomic_write_into_missing_dir_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope").join("r.txt");
        let e = write_atomic(&p, b"x").unwrap_err().to_string();
        assert!(e.contains("after 0 of 1 bytes; nothing was written"), "{e}");
    }

    #[test]
    fn temp_names_differ_per_call() {
        let p = Path::new("/x/r.json");
        let (a, b) = (temp_beside(p).unwrap(), temp_beside(p).unwrap());
        assert_ne!(a, b);
        let pid = std::process::id();
        assert!(a.to_string_lossy().starts_with(&format!("/x/.r.json.{pid}.")), "{}", a.display());
    }

    #[test]
    fn a_dead_writers_temp_is_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.txt");
        // pid_max is at most 2^22 on Linux: this process cannot exist.
        let dead = dir.path().join(".r.txt.99999999.0.tmp");
        let live = dir.path().join(format!(".r.txt.{}.999.tmp", std::process::id()));
        let other = dir.path().join(".q.txt.99999999.0.tmp");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"partial").unwrap();
        }
        write_atomic(&p, b"whole").unwrap();
        assert!(!dead.exists(), "a dead writer's temp file stays");
        assert!(live.exists() && other.exists(), "a live writer's or another file's temp was removed");
    }
}
