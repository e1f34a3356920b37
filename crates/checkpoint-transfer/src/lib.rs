//! The data side of a restore: the resident checkpoint index (stage, acknowledge, publish, acquire, discard
//! after drain), the external `CheckpointStore` tiers (host memory, disk) and the `CopyEngine` implementations
//! (inline simulated, threaded host, CUDA) with drain-before-release.

mod checkpoint;
pub mod copy;
mod error;
mod index;
mod layout;
mod page_buf;
pub mod store;

pub use checkpoint::{
    CHECKPOINT_ID_BYTES_MAX, Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta,
    CheckpointPayload, PageSlot, PrefixQuery,
};
pub use copy::{
    CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyModel, CopyOutcome, CudaCopyEngine,
    DeviceCopyEngine, Fault, InlineCopyEngine, REORDER_DELAY_POLLS_MAX, ReorderingCopyEngine,
    StagingLimits, ThreadedCopyEngine,
};
pub use error::{Error, Invalid, Mismatch, Result};
pub use index::{
    AcquiredImport, CancelOutcome, ImportEvent, ImportId, ImportState, LookupBudget,
    RESTORE_LOOKUPS_MAX, ResidentIndex, StageRequest,
};
pub use layout::LayoutDescriptor;
pub use page_buf::{PageBuf, RankPages};
pub use store::{
    CheckpointStore, DiskStore, HostStore, PutOutcome, RedisStore, RejectedFile, RejectedKey,
    SharedStore, StoreStats, check_redis_url,
};
