//! The one error type of kv-pool. Misuse (null page, double free, out-of-range id, bad geometry) is an error
//! that names the value, never corruption.

/// Result of kv-pool operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kv-pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A consistency check (`check_invariants`) found the state broken: a bug, never the caller's input.
    #[error("invariant broken: {0}")]
    InvariantBroken(#[from] InvariantBroken),
    // --- pool and prefix index (pool.rs, prefix.rs) ---
    /// Pressure: fewer free pages (cached-free included) than requested; nothing was allocated.
    #[error("out of pages: requested {requested}, {free} free")]
    OutOfPages {
        /// Pages asked for.
        requested: u32,
        /// Free pages at the time (cached-free included).
        free: u32,
    },
    /// An operation named page 0, the null page, which is never allocated, freed, touched, cached or written.
    #[error("page 0 is the null page: it cannot be allocated, freed, touched, cached or written")]
    NullPage,
    /// A page id past the end of the pool.
    #[error("page {page} is out of range: the pool has {n_pages} pages")]
    PageOutOfRange {
        /// The offending page id.
        page: u32,
        /// Pages in the pool, the null page included.
        n_pages: u32,
    },
    /// `free` of a page whose reference count is already zero.
    #[error("double free of page {page}: its reference count is already 0")]
    DoubleFree {
        /// The offending page id.
        page: u32,
    },
    /// `cache_block` on a page that is not in use (reference count 0).
    #[error("page {page} is not in use: only a referenced page can be cached")]
    PageNotInUse {
        /// The offending page id.
        page: u32,
    },
    /// `cache_block` on a page that already holds a different block key; `uncache` it first.
    #[error("page {page} already holds another block key: uncache it first")]
    PageAlreadyCached {
        /// The offending page id.
        page: u32,
    },
    /// A non-forced prefix-cache reset while pages are in use; free the requests first (a forced reset does).
    #[error("cannot reset the prefix cache: {n} pages are in use; free them first")]
    PagesInUse {
        /// Pages with a reference count above zero.
        n: u32,
    },
    /// A pool needs the null page and at least one usable page.
    #[error(
        "a pool of {n_pages} pages is too small: it needs at least 2 (page 0 is the null page)"
    )]
    PoolTooSmall {
        /// Pages asked for, the null page included.
        n_pages: u32,
    },

    // --- geometry (geometry.rs) ---
    /// A geometry with `tokens_per_page == 0`.
    #[error("tokens_per_page is 0: a page must hold at least one token")]
    ZeroTokensPerPage,
    /// A geometry without cache groups.
    #[error("the geometry has no cache groups: give at least one")]
    NoCacheGroups,
    /// A cache group with `bytes_per_page == 0`.
    #[error("cache group {group_idx} has bytes_per_page 0: a page must hold at least one byte")]
    ZeroBytesPerPage {
        /// Index of the offending group.
        group_idx: usize,
    },
    /// A sliding-window group with `window_tokens == 0`.
    #[error("cache group {group_idx} has a sliding window of 0 tokens: use at least 1")]
    ZeroWindow {
        /// Index of the offending group.
        group_idx: usize,
    },
    /// A chunked-local group with `chunk_tokens == 0`.
    #[error("cache group {group_idx} has a local chunk of 0 tokens: use at least 1")]
    ZeroChunk {
        /// Index of the offending group.
        group_idx: usize,
    },
    /// An auxiliary group with `pages == 0`.
    #[error("cache group {group_idx} is auxiliary with 0 pages: use at least 1 or drop the group")]
    ZeroAuxiliaryPages {
        /// Index of the offending group.
        group_idx: usize,
    },
    /// A geometry with `context_parallel == 0`.
    #[error("context_parallel is 0: the context needs at least one rank")]
    ZeroContextParallel,
    /// A block (`tokens_per_page * context_parallel` tokens) that does not fit in a `u32`.
    #[error(
        "a block of {tokens_per_page} tokens per page on {context_parallel} ranks is more than {max} tokens"
    )]
    BlockTooLarge {
        /// Tokens per page.
        tokens_per_page: u32,
        /// Ranks.
        context_parallel: u32,
        /// The largest block.
        max: u32,
    },
    /// A geometry with `max_model_len == 0`.
    #[error("max_model_len is 0: the model must accept at least one token")]
    ZeroMaxModelLen,
    /// A sliding window longer than the model's maximum length.
    #[error(
        "cache group {group_idx} has a sliding window of {window_tokens} tokens, more than max_model_len {max_model_len}"
    )]
    WindowExceedsModelLen {
        /// Index of the offending group.
        group_idx: usize,
        /// The window asked for.
        window_tokens: u32,
        /// The model's maximum length.
        max_model_len: u32,
    },
    /// A sliding window's retained tail longer than the model's maximum length: no request could ever use it.
    #[error(
        "cache group {group_idx} keeps a retained tail of {retained_tail_tokens} tokens behind its window of \
         {window_tokens}, more than max_model_len {max_model_len}; use a tail of at most max_model_len"
    )]
    TailExceedsModelLen {
        /// Index of the offending group.
        group_idx: usize,
        /// The window.
        window_tokens: u32,
        /// The retained tail asked for.
        retained_tail_tokens: u32,
        /// The model's maximum length.
        max_model_len: u32,
    },
    /// A local-attention chunk longer than the model's maximum length.
    #[error(
        "cache group {group_idx} has a local chunk of {chunk_tokens} tokens, more than max_model_len {max_model_len}"
    )]
    ChunkExceedsModelLen {
        /// Index of the offending group.
        group_idx: usize,
        /// The chunk asked for.
        chunk_tokens: u32,
        /// The model's maximum length.
        max_model_len: u32,
    },

    // --- page storage (storage/) ---
    /// A storage shape with a zero rank count, page count or page size.
    #[error(
        "invalid page storage: {n_ranks} ranks, {n_pages} pages, {bytes_per_page} bytes per page; all must be positive"
    )]
    EmptyStorage {
        /// Ranks asked for.
        n_ranks: u32,
        /// Pages per rank asked for.
        n_pages: u32,
        /// Bytes per page asked for.
        bytes_per_page: usize,
    },
    /// A storage shape whose byte size does not fit in memory addresses.
    #[error(
        "page storage of {n_ranks} ranks x {n_pages} pages x {bytes_per_page} bytes is too large"
    )]
    StorageTooLarge {
        /// Ranks asked for.
        n_ranks: u32,
        /// Pages per rank asked for.
        n_pages: u32,
        /// Bytes per page asked for.
        bytes_per_page: usize,
    },
    /// A rank past the storage's shard count.
    #[error("rank {rank} is out of range: the storage has {n_ranks} ranks")]
    RankOutOfRange {
        /// The offending rank.
        rank: u32,
        /// Ranks in the storage.
        n_ranks: u32,
    },
    /// A read or write buffer whose length is not the page size.
    #[error("buffer of {len} bytes does not match the page size of {bytes_per_page} bytes")]
    BufferLength {
        /// Length of the buffer given.
        len: usize,
        /// The storage's page size.
        bytes_per_page: usize,
    },
    /// CUDA storage was asked for but no usable driver or device is present.
    #[error("cuda is unavailable: {reason}")]
    CudaUnavailable {
        /// Why: no libcuda, no device, or the driver failed to initialize.
        reason: String,
    },
    /// A CUDA driver call failed after the driver was found.
    #[error("cuda {operation} failed: {reason}")]
    CudaFailed {
        /// The operation that failed (allocate, read, write, copy, ...).
        operation: &'static str,
        /// The driver's error.
        reason: String,
    },
}

/// Which invariant a consistency check found broken, and how. Every layer's `Error` has an `InvariantBroken`
/// variant made from it, so one pair of macros (`ensure!`, `ensure_eq!`) serves every `check_invariants`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvariantBroken(pub String);

/// Returns the caller's `Error::InvariantBroken` naming the broken invariant when `$cond` is false
/// (consistency checks return errors; nothing reachable from the public API panics).
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(::core::convert::From::from($crate::InvariantBroken(format!($($arg)+))));
        }
    };
}

/// `ensure!` for two values that must be equal; the error shows both.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($arg:tt)+) => {
        match (&$left, &$right) {
            (left, right) => {
                if left != right {
                    return Err(::core::convert::From::from($crate::InvariantBroken(format!(
                        "{}: {:?} != {:?}",
                        format_args!($($arg)+),
                        left,
                        right
                    ))));
                }
            }
        }
    };
}
