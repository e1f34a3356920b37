//! The one error type of checkpoint-transfer. Invalid input (`Invalid`), a checkpoint that does not fit this
//! engine (`Mismatch`), damaged store files (`Corrupt`) and store pressure are distinct variants so callers can
//! branch: invalid and mismatch mean "recompute", pressure means "wait or evict".

use std::path::PathBuf;

use kv_pool::PageId;
use kv_pool::RequestId;

use crate::checkpoint::CheckpointId;

/// Result of checkpoint-transfer operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in checkpoint-transfer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consistency check (`check_invariants`) found the state broken: a bug, never the caller's input.
    #[error("invariant broken: {0}")]
    InvariantBroken(#[from] kv_pool::InvariantBroken),
    /// The caller's input is wrong; nothing was changed.
    #[error("invalid import: {0}")]
    Invalid(#[from] Invalid),
    /// A stored checkpoint was written for another engine layout or another token prefix (G6).
    #[error("checkpoint {id} does not match this engine: {mismatch}")]
    Mismatch {
        /// The checkpoint.
        id: CheckpointId,
        /// What differs.
        mismatch: Mismatch,
    },
    /// A stored file is truncated, damaged or not a kvgate checkpoint; it is never restored (G6).
    #[error("checkpoint file {path} is unusable: {reason}")]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A value on the Redis store is not a kvgate checkpoint, is damaged or changed under the engine; it is
    /// never restored (G6).
    #[error("checkpoint value {key} on the redis store is unusable: {reason}; it is not restored")]
    CorruptValue {
        /// The key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The Redis store did not do an operation: the server is unreachable, slow (the timeout) or refused it
    /// (maxmemory reached). Nothing was restored or stored by it.
    #[error("redis checkpoint store {url}: {reason}")]
    Remote {
        /// The server's URL, its password hidden.
        url: String,
        /// What failed and what to do.
        reason: String,
    },
    /// The store's thread is gone (the store panicked and was dropped): nothing was stored or read.
    #[error("checkpoint store unavailable: {reason}")]
    StoreUnavailable {
        /// What happened.
        reason: String,
    },
    /// The store holds no checkpoint with this id.
    #[error("no checkpoint {id} in the store")]
    NotFound {
        /// The id asked for.
        id: CheckpointId,
    },
    /// A put would replace a newer (or the same) generation of the checkpoint.
    #[error(
        "checkpoint {id} generation {generation} is not newer than the stored generation {stored}"
    )]
    StaleGeneration {
        /// The checkpoint.
        id: CheckpointId,
        /// The generation offered.
        generation: u64,
        /// The generation already stored.
        stored: u64,
    },
    /// The checkpoint alone is larger than the whole store.
    #[error(
        "checkpoint {id} needs {bytes} bytes, more than the store capacity of {capacity_bytes} bytes"
    )]
    TooLarge {
        /// The checkpoint.
        id: CheckpointId,
        /// Its payload size.
        bytes: u64,
        /// The store's capacity.
        capacity_bytes: u64,
    },
    /// Writing or removing a checkpoint's files failed (disk full, read-only file system, permission); the
    /// checkpoint is not stored.
    #[error(
        "cannot write checkpoint file {path}: {source}; free space on the disk or make the store directory \
         writable (the checkpoint is not stored)"
    )]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error: its kind says disk full, read-only file system or permission.
        source: std::io::Error,
    },
    /// Another store (another engine, here or in another process) holds the store directory.
    #[error(
        "store directory {dir} is in use by {holder}; stop that engine or give this one another directory"
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The holder as its lock file names it (pid and host).
        holder: String,
    },
    /// The store directory cannot be used.
    #[error("checkpoint store directory {dir:?} is not usable: {reason}")]
    StoreDir {
        /// The directory as given.
        dir: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A file system operation failed.
    #[error("store i/o on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The index holds no import for this request.
    #[error("no import for {request}")]
    UnknownImport {
        /// The request asked about.
        request: RequestId,
    },
    /// The import exists but is not in the state the operation needs.
    #[error("import for {request} is {state}, not {needed}")]
    WrongState {
        /// The request.
        request: RequestId,
        /// Its import's current state.
        state: &'static str,
        /// The state the operation needs.
        needed: &'static str,
    },
    /// A non-forced reset while imports are staged or owned (O3, X2).
    #[error(
        "cannot reset the prefix cache: {n_staged} imports staged and {n_owned} owned; force it or wait"
    )]
    ResetRefused {
        /// Imports still copying (cancelled ones draining included).
        n_staged: usize,
        /// Published imports not yet acquired.
        n_owned: usize,
    },
    /// A published import's pages are no longer all prefix hits; the restore must look up again.
    #[error("import for {request} lost page {page:?} before it was acquired; look up again")]
    Invalidated {
        /// The request.
        request: RequestId,
        /// The page that is no longer a hit.
        page: PageId,
    },
    /// The copy engine cannot run here (for example no CUDA driver).
    #[error("copy engine unavailable: {0}")]
    Unavailable(String),
    /// The page pool refused an operation.
    #[error("page pool: {0}")]
    Pool(#[from] kv_pool::Error),
}

/// Invalid stage input (contract R4, data half). Each variant names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The checkpoint covers no tokens.
    #[error("checkpoint {id} has zero tokens")]
    ZeroTokens {
        /// The checkpoint.
        id: CheckpointId,
    },
    /// The boundary lies past the end of the request.
    #[error("checkpoint boundary {n_tokens} is past the request's {request_tokens} tokens")]
    BoundaryPastRequest {
        /// The checkpoint boundary.
        n_tokens: usize,
        /// The request's length.
        request_tokens: usize,
    },
    /// The draft prefix is longer than the boundary.
    #[error("draft prefix of {draft_prefix_len} tokens is longer than the boundary {n_tokens}")]
    DraftPrefixTooLong {
        /// The draft prefix length.
        draft_prefix_len: usize,
        /// The checkpoint boundary.
        n_tokens: usize,
    },
    /// The checkpoint was captured on zero ranks.
    #[error("checkpoint {id} has zero ranks")]
    ZeroRanks {
        /// The checkpoint.
        id: CheckpointId,
    },
    /// The request already has a live import.
    #[error("{request} already has an import in the index")]
    IdInUse {
        /// The request.
        request: RequestId,
    },
    /// A page the import builds on is no longer owned by anyone.
    #[error("dependency page {page:?} is not owned (ref count zero)")]
    DependencyNotOwned {
        /// The page.
        page: PageId,
    },
    /// `ResidentIndex::stage_into` was given destination pages that do not fit the checkpoint.
    #[error(
        "destination page {page:?} is not usable: {reason}; pass one distinct owned page per checkpoint page"
    )]
    Destination {
        /// The page.
        page: PageId,
        /// Why: free, listed twice, or already an import's destination.
        reason: &'static str,
    },
    /// The checkpoint's layout does not match the pool's.
    #[error("layout: {0}")]
    Layout(Mismatch),
    /// The payload does not have one page of the right width per rank and checkpoint page.
    #[error(
        "payload of rank {rank} has {found} pages of the wrong shape, expected {expected} pages"
    )]
    PayloadShape {
        /// The rank.
        rank: usize,
        /// Pages expected.
        expected: usize,
        /// Pages found (or index of the first page of the wrong width).
        found: usize,
    },
    /// The keyed pages do not cover the block keys 0, 1, 2, ... in order.
    #[error("page {page_idx} carries block key index {key_idx}, expected {expected}")]
    PageKeys {
        /// Position of the page in the checkpoint.
        page_idx: usize,
        /// The key index it carries.
        key_idx: u32,
        /// The key index expected there.
        expected: u32,
    },
    /// A checkpoint id that is empty, too long or has control characters.
    #[error("checkpoint id {id:?} is not usable: {reason}")]
    CheckpointId {
        /// The id as given.
        id: String,
        /// Why.
        reason: &'static str,
    },
}

/// How a checkpoint's manifest differs from the engine (G6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Different number of ranks.
    #[error("written for {found} ranks, the engine has {expected}")]
    Ranks {
        /// The engine's rank count.
        expected: u32,
        /// The checkpoint's rank count.
        found: u32,
    },
    /// Different cache groups or group order.
    #[error("written for groups {found}, the engine has {expected}")]
    Groups {
        /// The engine's groups.
        expected: String,
        /// The checkpoint's groups.
        found: String,
    },
    /// Different page width.
    #[error("written for {found} bytes per page, the engine has {expected}")]
    PageWidth {
        /// The engine's page width.
        expected: u64,
        /// The checkpoint's page width.
        found: u64,
    },
    /// Different page size in tokens.
    #[error("written for {found} tokens per page, the engine has {expected}")]
    TokensPerPage {
        /// The engine's tokens per page.
        expected: u32,
        /// The checkpoint's tokens per page.
        found: u32,
    },
    /// The checkpoint's token prefix is not a prefix of the request.
    #[error("its token prefix ({n_tokens} tokens) is not a prefix of the request")]
    TokenPrefix {
        /// The checkpoint boundary.
        n_tokens: usize,
    },
    /// The checkpoint's first blocks are not a checkpoint of their own (a recurrent or auxiliary group, or an
    /// attention window whose pages it does not hold), or do not match the request's.
    #[error(
        "its first {n_blocks} blocks are not a restorable prefix of the request for groups {groups}"
    )]
    BlockPrefix {
        /// Blocks asked for.
        n_blocks: usize,
        /// The checkpoint's groups.
        groups: String,
    },
    /// Written by another format version.
    #[error("manifest format version {found}, this build reads {expected}")]
    FormatVersion {
        /// The version this build reads.
        expected: u32,
        /// The file's version.
        found: u32,
    },
}
