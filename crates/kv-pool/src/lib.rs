//! Paged KV-cache memory: the `PagePool` (page 0 null, ref counts, uncached free pages reused first from a
//! LIFO stack, cached free pages evicted lazily and silently in LRU order from an index-linked list), the
//! prefix index keyed by a collision-resistant hash chain, the `Geometry` of cache groups with the pure page
//! arithmetic over it, and `PageStorage` (host and CUDA).

mod error;
mod geometry;
mod gpu_test;
mod ids;
mod page;
mod pool;
mod storage;

pub use error::{Error, InvariantBroken, Result};
pub use geometry::{CacheGroup, Continuation, Geometry, GroupKind, RestoreNeed};
pub use gpu_test::{GPU_TEST_LOG_ENV, REQUIRE_GPU_ENV, gpu_test_gate};
pub use ids::{AdmissionOrder, RequestId, Timestamp};
pub use page::{BlockKey, BlockKeyHashBuilder, BlockKeyHasher, PageId};
pub use pool::{PagePool, PrefixChange};
pub use storage::{
    CudaDriver, CudaPinned, CudaStorage, Device, DeviceStorage, FakeDevice, FakeEvent, FakeFault,
    FakePinned, FakeStats, HostStorage, PagePrefix, PageStorage, StreamHold, cuda_available,
    read_run_by_page,
};
