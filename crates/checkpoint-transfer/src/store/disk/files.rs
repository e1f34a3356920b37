//! The disk store's file primitives: reading a file only when it is a regular file (never through a symbolic
//! link, never blocking on a FIFO or device, never past a size limit), atomic writes (temp file created
//! without following links, fsync, rename) and the directory's `LOCK` file that makes one engine its owner.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Name of the lock file in a store directory.
pub(crate) const LOCK_FILE: &str = "LOCK";

const TEMP_SUFFIX: &str = ".tmp";

/// Longest holder description read back from a lock file, in bytes.
const LOCK_BYTES_MAX: u64 = 4096;

/// Why a file was not read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The operating system refused (missing, permission, ...).
    Io(io::Error),
    /// It is not a regular file: a symbolic link, directory, FIFO, socket or device.
    NotRegular(&'static str),
    /// It is larger than the limit.
    TooLarge {
        /// Its length (at least `limit + 1` when it grows while read).
        len: u64,
        /// The limit.
        limit: u64,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(error) => write!(f, "cannot read: {error}"),
            ReadError::NotRegular(kind) => {
                write!(f, "it is {kind}, not a regular file; remove it")
            }
            ReadError::TooLarge { len, limit } => {
                write!(f, "it is {len} bytes, more than the limit of {limit}")
            }
        }
    }
}

/// The kind of a file that is not a regular file, or `None` for a regular file. `symlink_metadata`: a link
/// is a link, whatever it points to.
pub(crate) fn irregular_kind(metadata: &fs::Metadata) -> Option<&'static str> {
    let file_type = metadata.file_type();
    if file_type.is_file() {
        None
    } else if file_type.is_symlink() {
        Some("a symbolic link")
    } else if file_type.is_dir() {
        Some("a directory")
    } else {
        Some("a FIFO, socket or device")
    }
}

/// The length of `path` when it is a regular file (a link is not followed).
pub(crate) fn regular_len(path: &Path) -> Result<u64, ReadError> {
    let metadata = fs::symlink_metadata(path).map_err(ReadError::Io)?;
    match irregular_kind(&metadata) {
        Some(kind) => Err(ReadError::NotRegular(kind)),
        None => Ok(metadata.len()),
    }
}

/// The whole of `path`, read only when it is a regular file of at most `limit` bytes: checked before
/// opening, opened without following a link and without blocking, checked again on the open file (it may
/// have been replaced in between), and read through `Read::take` so a file that grows cannot exceed it.
pub(crate) fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    regular_len(path)?;
    let file = open_no_follow(OpenOptions::new().read(true), path).map_err(ReadError::Io)?;
    let metadata = file.metadata().map_err(ReadError::Io)?;
    if let Some(kind) = irregular_kind(&metadata) {
        return Err(ReadError::NotRegular(kind));
    }
    if metadata.len() > limit {
        return Err(ReadError::TooLarge {
            len: metadata.len(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            len: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// Opens with `O_NOFOLLOW` (a link in the last component fails) and `O_NONBLOCK` (a FIFO or device does not
/// block the open; regular files ignore it).
fn open_no_follow(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    }
    options.open(path)
}

/// Writes `path` atomically: a new temp file beside it (created exclusively, so never through a link), the
/// bytes, fsync, rename over `path`. On failure the temp file is removed and the error says which file.
pub(crate) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> Result<()> {
    let temp = temp_path(path);
    let result = (|| {
        remove_if_present(&temp)?;
        let file = open_no_follow(OpenOptions::new().write(true).create_new(true), &temp)?;
        let mut writer = io::BufWriter::with_capacity(1 << 20, &file);
        write(&mut writer)?;
        writer.flush()?;
        drop(writer);
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    result.map_err(|source| {
        let _ignored = fs::remove_file(&temp);
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Whether `name` is a temp file a write left behind.
pub(crate) fn is_temp(name: &str) -> bool {
    name.ends_with(TEMP_SUFFIX)
}

fn temp_path(path: &Path) -> PathBuf {
    let mut temp = path.as_os_str().to_owned();
    temp.push(TEMP_SUFFIX);
    PathBuf::from(temp)
}

/// Fsyncs a directory, so the renames and removals in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file; a missing one is not an error.
pub(crate) fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The exclusive lock on a store directory, held while the store is open and released when it is dropped
/// (the kernel releases it too when the process dies, so a killed engine never leaves it held).
#[derive(Debug)]
pub(crate) struct DirLock {
    file: File,
}

impl Drop for DirLock {
    /// Unlocks explicitly: a copy of the descriptor that a fork elsewhere in the process still holds (until
    /// its exec closes it) would otherwise keep the lock a moment after the store is gone.
    fn drop(&mut self) {
        let _ignored = self.file.unlock();
    }
}

impl DirLock {
    /// Takes the lock on `dir`, writing this process's pid and host into `LOCK`. A directory another store
    /// holds is `Error::Locked`, naming the holder.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let io_error = |source| Error::Io {
            path: path.clone(),
            source,
        };
        if let Ok(metadata) = fs::symlink_metadata(&path)
            && let Some(kind) = irregular_kind(&metadata)
        {
            return Err(io_error(io::Error::other(format!(
                "the lock file is {kind}; remove it"
            ))));
        }
        let mut file = open_no_follow(
            OpenOptions::new().read(true).write(true).create(true),
            &path,
        )
        .map_err(io_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let holder = read_regular(&path, LOCK_BYTES_MAX)
                    .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
                    .unwrap_or_default();
                return Err(Error::Locked {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another process".to_string()
                    } else {
                        holder
                    },
                });
            }
            Err(fs::TryLockError::Error(source)) => return Err(io_error(source)),
        }
        let holder = format!("pid {} on {}\n", std::process::id(), host_name());
        file.set_len(0)
            .and_then(|()| file.write_all(holder.as_bytes()))
            .map_err(io_error)?;
        Ok(DirLock { file })
    }
}

fn host_name() -> String {
    read_regular(Path::new("/proc/sys/kernel/hostname"), 256)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "an unknown host".to_string())
}
