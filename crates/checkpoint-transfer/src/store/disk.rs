//! `DiskStore`: checkpoints in a directory that survive restarts. Per checkpoint a bincode manifest (magic,
//! format version, manifest data with the layout it was written for, the BLAKE3 checksum of every page
//! payload) and a payload file named after its generation. Writes are atomic (temp file, fsync, rename,
//! directory fsync; the manifest last, so it never names a payload that is not complete). Reopening rebuilds
//! the index; leftover temp files are ignored; truncated, corrupted or foreign files are reported and never
//! restored (G6). Manifest decoding is size-limited. File names are hex-encoded ids: no id escapes the
//! directory.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::catalog::Catalog;
use crate::store::{CheckpointStore, PutOutcome, StoreStats};

/// Manifest format this build writes and reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// Largest manifest accepted, in bytes: a hostile file cannot make decoding allocate more.
pub const MANIFEST_BYTES_MAX: usize = 16 << 20;

const MANIFEST_MAGIC: [u8; 8] = *b"KVGATECK";
const MANIFEST_SUFFIX: &str = ".manifest";
const PAYLOAD_SUFFIX: &str = ".payload";
const TEMP_SUFFIX: &str = ".tmp";

/// A file found at open that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedFile {
    /// The file.
    pub path: PathBuf,
    /// Why it was not loaded.
    pub reason: String,
}

/// Checkpoints in a directory.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    catalog: Catalog,
    rejected: Vec<RejectedFile>,
}

#[derive(Serialize, Deserialize)]
struct DiskManifest {
    magic: [u8; 8],
    format_version: u32,
    meta: CheckpointMeta,
    payload_bytes: u64,
    /// BLAKE3 of every page, rank-major (rank 0's pages first).
    page_checksums: Vec<[u8; 32]>,
}

impl DiskStore {
    /// Opens (creating if needed) a store in `dir` holding at most `capacity_bytes` of payload, and rebuilds
    /// its index from the manifests there. Unusable files are listed by `rejected`, never loaded.
    pub fn open(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| io_error(&dir, source))?;
        let mut store = Self {
            catalog: Catalog::new(capacity_bytes),
            rejected: Vec::new(),
            dir,
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

    /// Files found at open that were not loaded (truncated, corrupted, foreign, wrong version).
    pub fn rejected(&self) -> &[RejectedFile] {
        &self.rejected
    }

    /// Path of the manifest of `id`.
    pub fn manifest_path(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{}{MANIFEST_SUFFIX}", file_stem(id)))
    }

    /// Path of the payload of generation `generation` of `id`.
    pub fn payload_path(&self, id: &CheckpointId, generation: u64) -> PathBuf {
        self.dir
            .join(format!("{}.{generation}{PAYLOAD_SUFFIX}", file_stem(id)))
    }

    fn rebuild(&mut self) -> Result<()> {
        let entries = fs::read_dir(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        let mut loaded: Vec<(SystemTime, DiskManifest)> = Vec::new();
        let mut payload_files: Vec<PathBuf> = Vec::new();
        let mut keep_stems: HashSet<String> = HashSet::new();
        for entry in entries {
            let entry = entry.map_err(|source| io_error(&self.dir, source))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(TEMP_SUFFIX) {
                // A write that never completed: never part of the store.
                tracing::info!(path = %path.display(), "removing leftover temp file");
                let _ignored = fs::remove_file(&path);
            } else if name.ends_with(PAYLOAD_SUFFIX) {
                payload_files.push(path);
            } else if let Some(stem) = name.strip_suffix(MANIFEST_SUFFIX) {
                match self.load_manifest(&path, stem) {
                    Ok(manifest) => {
                        let mtime = entry
                            .metadata()
                            .and_then(|m| m.modified())
                            .unwrap_or(SystemTime::UNIX_EPOCH);
                        loaded.push((mtime, manifest));
                    }
                    Err(reason) => {
                        tracing::warn!(path = %path.display(), %reason, "checkpoint manifest rejected");
                        keep_stems.insert(stem.to_string());
                        self.rejected.push(RejectedFile { path, reason });
                    }
                }
            }
        }
        loaded.sort_by_key(|(mtime, _)| *mtime);
        let mut referenced: HashSet<PathBuf> = HashSet::new();
        for (_, manifest) in loaded {
            let meta = manifest.meta;
            let outcome = self.catalog.plan_put(&meta, manifest.payload_bytes);
            match outcome {
                Ok(outcome) => {
                    for evicted in &outcome.evicted {
                        self.delete_files(evicted)?;
                    }
                    referenced.insert(self.payload_path(&meta.id, meta.generation));
                    self.catalog.insert(Arc::new(meta), manifest.payload_bytes);
                }
                Err(err) => {
                    let path = self.manifest_path(&meta.id);
                    self.rejected.push(RejectedFile {
                        path,
                        reason: err.to_string(),
                    });
                }
            }
        }
        for path in payload_files {
            let stem_matches = |stem: &String| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}.")))
            };
            if !referenced.contains(&path) && !keep_stems.iter().any(stem_matches) {
                tracing::info!(path = %path.display(), "removing payload no manifest names");
                let _ignored = fs::remove_file(&path);
            }
        }
        Ok(())
    }

    /// Reads and checks one manifest; the reason it is unusable otherwise.
    fn load_manifest(&self, path: &Path, stem: &str) -> Result<DiskManifest, String> {
        let len = fs::metadata(path)
            .map_err(|e| format!("cannot stat: {e}"))?
            .len();
        if len > MANIFEST_BYTES_MAX as u64 {
            return Err(format!(
                "manifest is {len} bytes, more than the limit of {MANIFEST_BYTES_MAX}"
            ));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        File::open(path)
            .and_then(|mut file| file.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read: {e}"))?;
        let manifest = decode_manifest(&bytes)?;
        if file_stem(&manifest.meta.id) != stem {
            return Err(format!(
                "manifest names checkpoint {} but its file name does not",
                manifest.meta.id
            ));
        }
        let expected_checksums = manifest.meta.pages.len() * manifest.meta.layout.n_ranks as usize;
        if manifest.page_checksums.len() != expected_checksums
            || manifest.payload_bytes != manifest.meta.payload_bytes()
        {
            return Err("manifest's checksums or payload size do not match its pages".to_string());
        }
        let payload = self.payload_path(&manifest.meta.id, manifest.meta.generation);
        let payload_len = fs::metadata(&payload)
            .map_err(|e| format!("payload {} is missing: {e}", payload.display()))?
            .len();
        if payload_len != manifest.payload_bytes {
            return Err(format!(
                "payload {} is {payload_len} bytes, the manifest says {}",
                payload.display(),
                manifest.payload_bytes
            ));
        }
        Ok(manifest)
    }

    fn delete_files(&self, id: &CheckpointId) -> Result<()> {
        let manifest = self.manifest_path(id);
        let stem = file_stem(id);
        remove_if_present(&manifest)?;
        let entries = fs::read_dir(&self.dir).map_err(|source| io_error(&self.dir, source))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{stem}.")) && name.ends_with(PAYLOAD_SUFFIX) {
                remove_if_present(&entry.path())?;
            }
        }
        Ok(())
    }

    fn write_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        let meta = &checkpoint.meta;
        let payload_path = self.payload_path(&meta.id, meta.generation);
        let mut page_checksums = Vec::new();
        write_atomically(&payload_path, |file| {
            for pages in &checkpoint.payload.ranks {
                for page in pages {
                    page_checksums.push(*blake3::hash(page).as_bytes());
                    file.write_all(page)?;
                }
            }
            Ok(())
        })?;
        let manifest = DiskManifest {
            magic: MANIFEST_MAGIC,
            format_version: MANIFEST_FORMAT_VERSION,
            meta: meta.clone(),
            payload_bytes: checkpoint.payload.n_bytes(),
            page_checksums,
        };
        let bytes =
            bincode::serde::encode_to_vec(&manifest, bincode::config::standard()).map_err(|e| {
                Error::Corrupt {
                    path: self.manifest_path(&meta.id),
                    reason: format!("cannot encode manifest: {e}"),
                }
            })?;
        write_atomically(&self.manifest_path(&meta.id), |file| file.write_all(&bytes))?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| io_error(&self.dir, source))
    }

    /// Reads and verifies the payload of a stored checkpoint.
    fn read_payload(&self, meta: &CheckpointMeta) -> Result<CheckpointPayload> {
        let path = self.payload_path(&meta.id, meta.generation);
        let corrupt = |reason: String| Error::Corrupt {
            path: path.clone(),
            reason,
        };
        let manifest_bytes =
            fs::read(self.manifest_path(&meta.id)).map_err(|source| io_error(&path, source))?;
        let manifest = decode_manifest(&manifest_bytes).map_err(&corrupt)?;
        if manifest.meta != *meta {
            return Err(corrupt(
                "the manifest changed on disk since the store was opened".into(),
            ));
        }
        let bytes = fs::read(&path).map_err(|source| io_error(&path, source))?;
        if bytes.len() as u64 != manifest.payload_bytes {
            return Err(corrupt(format!(
                "payload is {} bytes, the manifest says {}",
                bytes.len(),
                manifest.payload_bytes
            )));
        }
        let bytes_per_page = meta.layout.bytes_per_page as usize;
        let n_pages = meta.pages.len();
        let mut ranks = Vec::with_capacity(meta.layout.n_ranks as usize);
        for rank in 0..meta.layout.n_ranks as usize {
            let mut pages: Vec<Arc<[u8]>> = Vec::with_capacity(n_pages);
            for page_idx in 0..n_pages {
                let flat_idx = rank * n_pages + page_idx;
                let page = &bytes[flat_idx * bytes_per_page..(flat_idx + 1) * bytes_per_page];
                if *blake3::hash(page).as_bytes() != manifest.page_checksums[flat_idx] {
                    return Err(corrupt(format!(
                        "page {page_idx} of rank {rank} fails its checksum"
                    )));
                }
                pages.push(Arc::from(page));
            }
            ranks.push(pages);
        }
        Ok(CheckpointPayload { ranks })
    }
}

impl CheckpointStore for DiskStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        self.catalog.find_longest(query)
    }

    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        self.catalog.find_longest_prefix(query)
    }

    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        checkpoint.payload.check_shape(&checkpoint.meta)?;
        let n_bytes = checkpoint.payload.n_bytes();
        let outcome = self.catalog.plan_put(&checkpoint.meta, n_bytes)?;
        for evicted in &outcome.evicted {
            self.delete_files(evicted)?;
        }
        self.write_checkpoint(&checkpoint)?;
        if let Some(old_generation) = outcome.superseded_generation {
            remove_if_present(&self.payload_path(&checkpoint.meta.id, old_generation))?;
        }
        self.catalog.insert(Arc::new(checkpoint.meta), n_bytes);
        Ok(outcome)
    }

    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        let meta = self
            .catalog
            .meta(id)
            .ok_or_else(|| Error::NotFound { id: id.clone() })?;
        match self.read_payload(&meta) {
            Ok(payload) => {
                self.catalog.touch(id);
                Ok(Checkpoint {
                    meta: CheckpointMeta::clone(&meta),
                    payload,
                })
            }
            Err(err) => {
                // Never restored: drop it from the index so no later lookup finds it again.
                tracing::warn!(checkpoint = %id, error = %err, "checkpoint rejected, recompute instead");
                self.catalog.remove(id);
                Err(err)
            }
        }
    }

    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.catalog.meta(id)
    }

    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        let was_stored = self.catalog.remove(id).is_some();
        if was_stored {
            self.delete_files(id)?;
        }
        Ok(was_stored)
    }

    fn stats(&self) -> StoreStats {
        self.catalog.stats()
    }
}

fn decode_manifest(bytes: &[u8]) -> Result<DiskManifest, String> {
    let config = bincode::config::standard().with_limit::<MANIFEST_BYTES_MAX>();
    let describe = |e: bincode::error::DecodeError| match e {
        bincode::error::DecodeError::UnexpectedEnd { .. } => {
            format!("truncated manifest ({} bytes): {e}", bytes.len())
        }
        other => format!("undecodable manifest: {other}"),
    };
    let ((magic, format_version), _): (([u8; 8], u32), usize) =
        bincode::serde::decode_from_slice(bytes, config).map_err(describe)?;
    if magic != MANIFEST_MAGIC {
        return Err("not a kvgate checkpoint manifest (foreign file)".to_string());
    }
    if format_version != MANIFEST_FORMAT_VERSION {
        return Err(format!(
            "manifest format version {format_version}, this build reads {MANIFEST_FORMAT_VERSION}"
        ));
    }
    let (manifest, n_read): (DiskManifest, usize) =
        bincode::serde::decode_from_slice(bytes, config).map_err(describe)?;
    if n_read != bytes.len() {
        return Err(format!(
            "manifest has {} trailing bytes",
            bytes.len() - n_read
        ));
    }
    Ok(manifest)
}

/// Hex of the id's bytes: only `[0-9a-f]`, so a file name can never leave the directory.
fn file_stem(id: &CheckpointId) -> String {
    let mut stem = String::with_capacity(id.as_str().len() * 2 + 5);
    stem.push_str("ckpt-");
    for byte in id.as_str().bytes() {
        stem.push_str(&format!("{byte:02x}"));
    }
    stem
}

fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<&File>) -> std::io::Result<()>,
) -> Result<()> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(TEMP_SUFFIX);
    let temp = PathBuf::from(temp);
    let result = (|| {
        let file = File::create(&temp)?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, &file);
        write(&mut writer)?;
        writer.flush()?;
        drop(writer);
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    result.map_err(|source| {
        let _ignored = fs::remove_file(&temp);
        io_error(path, source)
    })
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(path, e)),
        _ => Ok(()),
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
