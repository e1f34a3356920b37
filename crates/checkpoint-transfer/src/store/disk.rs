//! `DiskStore`: checkpoints in a directory that survive restarts. Per checkpoint a manifest (`manifest`:
//! magic, format version, the manifest data with the layout it was written for, the BLAKE3 checksum of every
//! page payload, and a BLAKE3 checksum of the manifest's own bytes) and a payload file named after its
//! generation. Writes are atomic (temp file, fsync, rename, directory fsync; the payload first, the manifest
//! last, so a manifest never names a payload that is not complete). One store owns its directory at a time
//! (an exclusive lock on `LOCK`, naming the holder). Reopening rebuilds the index; leftover temp files and
//! payloads no manifest names are removed; truncated, corrupted, foreign or non-regular files are reported
//! and never restored (G6). Every file is read only when it is a regular file, never through a link, and
//! within a size limit (`files`). A capacity below what the directory holds evicts whole checkpoints, least
//! recently written first, with a warning. File names are hex-encoded ids: no id escapes the directory.

mod files;

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use self::files::{DirLock, ReadError};
use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload};
use crate::error::{Error, Result};
use crate::store::PutOutcome;
use crate::store::catalog::Catalog;
use crate::store::manifest::{self, MANIFEST_BYTES_MAX, ManifestBody, id_stem as file_stem};
use crate::store::tier::Tier;

const MANIFEST_SUFFIX: &str = ".manifest";
const PAYLOAD_SUFFIX: &str = ".payload";

/// Evicted checkpoints named one by one in the warning of an open that shrank the store.
const EVICTED_NAMED_MAX: usize = 8;

/// A file found at open that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RejectedFile {
    /// The file.
    pub path: PathBuf,
    /// Why it was not loaded.
    pub reason: String,
}

/// Checkpoints in a directory, which it owns while open. A failed write (`Error::Write`: disk full, read-only
/// file system, permission) leaves the checkpoint unstored, its superseded generation gone, and counts in
/// `StoreStats::n_write_failures`.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    catalog: Catalog,
    rejected: Vec<RejectedFile>,
    evicted_at_open: Vec<CheckpointId>,
    _lock: DirLock,
}

impl DiskStore {
    /// Opens (creating if needed) a store in `dir` holding at most `capacity_bytes` of payload, takes the
    /// directory's lock (`Error::Locked` when another store holds it) and rebuilds its index from the
    /// manifests there. Unusable files are listed by `rejected`, never loaded; checkpoints beyond the capacity
    /// are evicted whole (`evicted_at_open`).
    pub fn open(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Result<Self> {
        let dir = dir.into();
        if dir.as_os_str().is_empty() {
            return Err(Error::StoreDir {
                dir,
                reason: "the path is empty; name a directory",
            });
        }
        fs::create_dir_all(&dir).map_err(|source| io_error(&dir, source))?;
        let lock = DirLock::acquire(&dir)?;
        let mut store = Self {
            catalog: Catalog::new(capacity_bytes),
            rejected: Vec::new(),
            evicted_at_open: Vec::new(),
            dir,
            _lock: lock,
        };
        store.rebuild()?;
        Ok(store)
    }

    /// Asserts the catalog's indexes agree with its entries.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.catalog.check_invariants();
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Files found at open that were not loaded (truncated, corrupted, foreign, wrong version, not a
    /// regular file).
    #[cfg(test)]
    pub(crate) fn rejected(&self) -> &[RejectedFile] {
        &self.rejected
    }

    /// Checkpoints deleted at open because the directory held more than the capacity (or one alone was
    /// larger than it), least recently written first.
    #[cfg(test)]
    pub(crate) fn evicted_at_open(&self) -> &[CheckpointId] {
        &self.evicted_at_open
    }

    /// Path of the manifest of `id`.
    pub(crate) fn manifest_path(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{}{MANIFEST_SUFFIX}", file_stem(id)))
    }

    /// Path of the payload of generation `generation` of `id`.
    pub(crate) fn payload_path(&self, id: &CheckpointId, generation: u64) -> PathBuf {
        self.dir
            .join(format!("{}.{generation}{PAYLOAD_SUFFIX}", file_stem(id)))
    }

    fn rebuild(&mut self) -> Result<()> {
        let entries = fs::read_dir(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        let mut loaded: Vec<(SystemTime, ManifestBody)> = Vec::new();
        let mut payload_files: Vec<PathBuf> = Vec::new();
        let mut keep_stems: HashSet<String> = HashSet::new();
        for entry in entries {
            let entry = entry.map_err(|source| io_error(&self.dir, source))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if files::is_temp(&name) {
                // A write that never completed: never part of the store.
                tracing::info!(path = %path.display(), "removing leftover temp file");
                self.remove_stray(path);
            } else if name.ends_with(PAYLOAD_SUFFIX) {
                payload_files.push(path);
            } else if let Some(stem) = name.strip_suffix(MANIFEST_SUFFIX) {
                match self.load_manifest(&path, stem) {
                    Ok(manifest) => {
                        // `DirEntry::metadata` does not follow links; the manifest is a regular file.
                        let mtime = entry
                            .metadata()
                            .and_then(|m| m.modified())
                            .unwrap_or(SystemTime::UNIX_EPOCH);
                        loaded.push((mtime, manifest));
                    }
                    Err(reason) => {
                        keep_stems.insert(stem.to_string());
                        self.reject(path, reason);
                    }
                }
            }
        }
        let referenced = self.load_in_write_order(loaded)?;
        for path in payload_files {
            let stem_matches = |stem: &String| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}.")))
            };
            if !referenced.contains(&path) && !keep_stems.iter().any(stem_matches) {
                tracing::info!(path = %path.display(), "removing payload no manifest names");
                self.remove_stray(path);
            }
        }
        files::sync_dir(&self.dir).map_err(|source| io_error(&self.dir, source))
    }

    /// Inserts the loaded manifests oldest first, evicting whole checkpoints (least recently written first)
    /// when they hold more than the capacity. Returns the payloads the loaded checkpoints name.
    fn load_in_write_order(
        &mut self,
        mut loaded: Vec<(SystemTime, ManifestBody)>,
    ) -> Result<HashSet<PathBuf>> {
        loaded.sort_by_key(|(mtime, _)| *mtime);
        let mut referenced: HashSet<PathBuf> = HashSet::new();
        let mut evicted_bytes = 0u64;
        let mut sizes = std::collections::HashMap::new();
        for (_, manifest) in loaded {
            let meta = manifest.meta;
            match self.catalog.plan_put(&meta, manifest.payload_bytes) {
                Ok(outcome) => {
                    for evicted in outcome.evicted {
                        self.delete_files(&evicted)?;
                        evicted_bytes += sizes.get(&evicted).copied().unwrap_or(0);
                        self.evicted_at_open.push(evicted);
                    }
                    referenced.insert(self.payload_path(&meta.id, meta.generation));
                    sizes.insert(meta.id.clone(), manifest.payload_bytes);
                    self.catalog.insert(Arc::new(meta), manifest.payload_bytes);
                }
                Err(Error::TooLarge { .. }) => {
                    self.delete_files(&meta.id)?;
                    evicted_bytes += manifest.payload_bytes;
                    self.evicted_at_open.push(meta.id);
                }
                Err(err) => {
                    let path = self.manifest_path(&meta.id);
                    self.reject(path, err.to_string());
                }
            }
        }
        if !self.evicted_at_open.is_empty() {
            let named: Vec<String> = self
                .evicted_at_open
                .iter()
                .take(EVICTED_NAMED_MAX)
                .map(ToString::to_string)
                .collect();
            tracing::warn!(
                dir = %self.dir.display(),
                n_evicted = self.evicted_at_open.len(),
                evicted_bytes,
                capacity_bytes = self.catalog.stats().capacity_bytes,
                first_evicted = %named.join(", "),
                "the store directory held more than the capacity: evicted whole checkpoints, least recently \
                 written first"
            );
        }
        Ok(referenced)
    }

    fn reject(&mut self, path: PathBuf, reason: String) {
        tracing::warn!(path = %path.display(), %reason, "checkpoint file rejected, skipped");
        self.rejected.push(RejectedFile { path, reason });
    }

    /// Removes a temp file or an unnamed payload; one that cannot be removed (a directory) is reported.
    fn remove_stray(&mut self, path: PathBuf) {
        if let Err(error) = files::remove_if_present(&path) {
            self.reject(
                path,
                format!("cannot remove it: {error}; remove it by hand"),
            );
        }
    }

    /// Reads and checks one manifest; the reason it is unusable otherwise.
    fn load_manifest(&self, path: &Path, stem: &str) -> Result<ManifestBody, String> {
        let bytes = files::read_regular(path, MANIFEST_BYTES_MAX as u64)
            .map_err(|e| format!("manifest unusable: {e}"))?;
        let manifest = manifest::decode(&bytes)?;
        if file_stem(&manifest.meta.id) != stem {
            return Err(format!(
                "manifest names checkpoint {} but its file name does not",
                manifest.meta.id
            ));
        }
        let payload = self.payload_path(&manifest.meta.id, manifest.meta.generation);
        let payload_len = files::regular_len(&payload).map_err(|e| match e {
            ReadError::Io(e) => format!("payload {} is missing: {e}", payload.display()),
            other => format!("payload {} is unusable: {other}", payload.display()),
        })?;
        if payload_len != manifest.payload_bytes {
            return Err(format!(
                "payload {} is {payload_len} bytes, the manifest says {}",
                payload.display(),
                manifest.payload_bytes
            ));
        }
        Ok(manifest)
    }

    /// Deletes a checkpoint's manifest, then every payload of its id (a crash in between leaves only
    /// payloads, which the next open removes). Tries every file; the first failure is returned.
    fn delete_files(&self, id: &CheckpointId) -> Result<()> {
        let manifest = self.manifest_path(id);
        let stem = format!("{}.", file_stem(id));
        files::remove_if_present(&manifest).map_err(|source| write_error(&manifest, source))?;
        let entries = fs::read_dir(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        let mut first_error = None;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&stem) && name.ends_with(PAYLOAD_SUFFIX) {
                let path = entry.path();
                if let Err(source) = files::remove_if_present(&path) {
                    first_error.get_or_insert_with(|| write_error(&path, source));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        let meta = &checkpoint.meta;
        let payload_path = self.payload_path(&meta.id, meta.generation);
        files::write_atomically(&payload_path, |file| {
            checkpoint
                .payload
                .ranks
                .iter()
                .flat_map(crate::page_buf::RankPages::pages)
                .try_for_each(|page| file.write_all(page))
        })?;
        // The payload's rename is durable before a manifest names it.
        files::sync_dir(&self.dir).map_err(|source| write_error(&self.dir, source))?;
        let manifest_path = self.manifest_path(&meta.id);
        let bytes =
            manifest::encode(&ManifestBody::of(checkpoint)).map_err(|reason| Error::Corrupt {
                path: manifest_path.clone(),
                reason,
            })?;
        files::write_atomically(&manifest_path, |file| file.write_all(&bytes))?;
        files::sync_dir(&self.dir).map_err(|source| write_error(&self.dir, source))
    }
}

impl Tier for DiskStore {
    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    /// Deletes the files of what the catalog dropped and writes the checkpoint; on failure deletes what was
    /// written of it and what remains of the generation it supersedes (the catalog no longer holds either).
    fn write(&mut self, checkpoint: Checkpoint, outcome: &PutOutcome) -> Result<CheckpointMeta> {
        for evicted in &outcome.evicted {
            self.delete_files(evicted)?;
        }
        let id = &checkpoint.meta.id;
        if let Err(error) = self.write_checkpoint(&checkpoint) {
            if outcome.superseded_generation.is_some() {
                let _ignored = self.delete_files(id);
            } else {
                let payload = self.payload_path(id, checkpoint.meta.generation);
                let _ignored = files::remove_if_present(&payload);
            }
            return Err(error);
        }
        if let Some(old_generation) = outcome.superseded_generation {
            let old = self.payload_path(id, old_generation);
            files::remove_if_present(&old).map_err(|source| write_error(&old, source))?;
        }
        Ok(checkpoint.meta)
    }

    /// Reads and verifies the payload of a stored checkpoint.
    fn read(&mut self, meta: &CheckpointMeta) -> Result<CheckpointPayload> {
        let manifest_path = self.manifest_path(&meta.id);
        let manifest_bytes = files::read_regular(&manifest_path, MANIFEST_BYTES_MAX as u64)
            .map_err(|e| read_error(&manifest_path, e))?;
        let path = self.payload_path(&meta.id, meta.generation);
        let corrupt = |reason: String| Error::Corrupt {
            path: path.clone(),
            reason,
        };
        let manifest = manifest::decode(&manifest_bytes).map_err(&corrupt)?;
        if manifest.meta != *meta {
            return Err(corrupt(
                "the manifest changed on disk since the store was opened".into(),
            ));
        }
        // `decode` checked the sizes: payload bytes = pages x ranks x page width, one checksum per page.
        let bytes =
            files::read_regular(&path, manifest.payload_bytes).map_err(|e| read_error(&path, e))?;
        manifest.verify_payload(&bytes).map_err(corrupt)
    }

    fn read_failed(&mut self, id: &CheckpointId, error: &Error) {
        // Never restored: dropped from the index so no later lookup finds it again.
        tracing::warn!(checkpoint = %id, %error, "checkpoint rejected, recompute instead");
    }

    fn delete(&mut self, meta: &CheckpointMeta) -> Result<()> {
        self.delete_files(&meta.id)
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_error(path: &Path, source: std::io::Error) -> Error {
    Error::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// A file that could not be read: the system's error, or a file that is not what the store wrote.
fn read_error(path: &Path, error: ReadError) -> Error {
    match error {
        ReadError::Io(source) => io_error(path, source),
        other => Error::Corrupt {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    }
}
