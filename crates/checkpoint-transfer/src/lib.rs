//! The data side of a restore: the resident checkpoint index (stage, acknowledge, publish, acquire, discard
//! after drain), the external `CheckpointStore` tiers (host memory, disk) and the `CopyEngine` implementations
//! (inline simulated, threaded host, CUDA) with drain-before-release.

mod checkpoint;
mod copy;
mod error;
mod index;
mod layout;
mod page_buf;
mod store;

pub use checkpoint::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, PageSlot,
    PrefixQuery,
};
pub use copy::{
    CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyModel, CopyOutcome, CudaCopyEngine,
    DeviceCopyEngine, Fault, InlineCopyEngine, ReorderingCopyEngine, StagingLimits,
    ThreadedCopyEngine,
};
pub use error::{Error, Invalid, Mismatch, Result};
pub use index::{
    AcquiredImport, CancelOutcome, ImportEvent, ImportId, ImportState, RESTORE_LOOKUPS_MAX,
    ResidentIndex, StageRequest,
};
pub use layout::LayoutDescriptor;
pub use page_buf::{PageBuf, RankPages};
pub use store::{
    CheckpointStore, DEFAULT_KEY_PREFIX, DiskStore, Found, HostStore, KEY_PREFIX_BYTES_MAX, Lookup,
    PutOutcome, RedisStore, SharedStore, StoreLink, StoreStats, check_redis_url,
};
