//! How an engine is made (`Engine::builder`, the one way): its parameters, then whatever replaces a part the
//! parameters would open (the executor, the checkpoint store, the page bytes and copy engine, the clock).

use std::sync::Arc;

use checkpoint_transfer::{
    CheckpointStore, CopyEngine, CopyModel, CudaCopyEngine, DiskStore, HostStore, InlineCopyEngine,
    RedisStore, ReorderingCopyEngine, StoreLink, ThreadedCopyEngine,
};
use kv_pool::{CudaStorage, HostStorage, PagePool, PageStorage};

use super::groups::GroupCoordinator;
use super::parts::{Ids, Restores, StepScratch, StepTime, Tally, Watchdog};
use super::restore_policy;
use super::table::RequestTable;
use super::{Clock, Engine, SimClock, WallClock};
use crate::error::{Error, Result};
use crate::executor::{Executor, SimExecutor};
use crate::params::{ClockKind, CopyEngineKind, EngineParams, StorageKind};

/// Builds an [`Engine`] from [`EngineParams`]: `Engine::builder(params)`, then the parts to use in place of
/// those the parameters ask for, then `build`.
///
/// ```
/// use engine::{Engine, EngineParams, SimExecutor};
///
/// let params = EngineParams::default();
/// let executor = SimExecutor::new(params.cost.clone());
/// let engine = Engine::builder(params).executor(executor).build().unwrap();
/// assert!(engine.is_idle());
/// ```
pub struct Builder<E: Executor = SimExecutor> {
    params: EngineParams,
    executor: E,
    store: Option<Box<dyn CheckpointStore>>,
    page_bytes: Option<(Arc<dyn PageStorage>, Box<dyn CopyEngine>)>,
    clock: Option<Box<dyn Clock>>,
}

impl<E: Executor> std::fmt::Debug for Builder<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("params", &self.params)
            .field("store", &self.store.is_some())
            .field("page_bytes", &self.page_bytes.is_some())
            .field("clock", &self.clock.as_ref().map(|clock| clock.name()))
            .finish_non_exhaustive()
    }
}

impl Engine<SimExecutor> {
    /// An engine with the simulated executor built from `params.cost` and every part `params` asks for:
    /// `Engine::builder(params).build()`.
    pub fn new(params: EngineParams) -> Result<Self> {
        Engine::builder(params).build()
    }

    /// A builder of an engine from `params`, with the simulated executor built from `params.cost` until
    /// `Builder::executor` gives another.
    pub fn builder(params: EngineParams) -> Builder<SimExecutor> {
        Builder {
            executor: SimExecutor::new(params.cost.clone()),
            params,
            store: None,
            page_bytes: None,
            clock: None,
        }
    }
}

impl<E: Executor> Builder<E> {
    /// Drives `executor`. An executor that needs pages of its own size (a real model) sets
    /// `sim_bytes_per_page` to it; it checks the rest of the parameters itself (`Executor::check_params`).
    pub fn executor<F: Executor>(self, executor: F) -> Builder<F> {
        Builder {
            params: self.params,
            executor,
            store: self.store,
            page_bytes: self.page_bytes,
            clock: self.clock,
        }
    }

    /// Puts checkpoints in `store` instead of the store the parameters ask for (`store_dir`, `store_url` and
    /// `store_capacity_pages` then open none): engines built with clones of one `SharedStore` restore each
    /// other's checkpoints.
    pub fn store(mut self, store: Box<dyn CheckpointStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Keeps page bytes in `storage` and restores through `copies` instead of those `storage` and
    /// `copy_engine` ask for: how a test runs the engine on a stand-in device whose copies it holds in
    /// flight. `copies` must write into `storage` and have nothing in flight; `build` refuses otherwise
    /// (`InvalidParam` naming `storage` when its shape is not the pool's, `context_parallel` ranks of
    /// `pool_pages()` pages of `sim_bytes_per_page` bytes, or `copy_engine` when `copies` has jobs).
    pub fn page_storage(
        mut self,
        storage: Arc<dyn PageStorage>,
        copies: Box<dyn CopyEngine>,
    ) -> Self {
        self.page_bytes = Some((storage, copies));
        self
    }

    /// Reads time from `clock` instead of the one `params.clock` names (L1): a test's or a server's own.
    pub fn clock(mut self, clock: Box<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The engine. Errors: the parameters (`InvalidParam` naming one), the executor's own checks, a geometry
    /// the step loop does not run, or a part that cannot be opened (storage, copy engine, store).
    pub fn build(self) -> Result<Engine<E>> {
        let Builder {
            mut params,
            executor,
            store,
            page_bytes,
            clock,
        } = self;
        if let Some(bytes_per_page) = executor.bytes_per_page() {
            params.sim_bytes_per_page = bytes_per_page;
        }
        params.validate()?;
        executor.check_params(&params)?;
        let n_ranks = params.geometry.context_parallel();
        let n_pages = params.pool_pages();
        let pool = PagePool::new(n_pages)?;
        // One shard per rank: a page id names that page on every rank (`Geometry::block_tokens`).
        let (storage, copies) = match page_bytes {
            Some((storage, copies)) => {
                check_given_page_bytes(&params, &*storage, &*copies, n_ranks, n_pages)?;
                (storage, copies)
            }
            None => {
                let storage = open_storage(&params, n_ranks, n_pages)?;
                let model = copy_model(&params, &executor);
                let copies = open_copy_engine(&params, model, &storage)?;
                (storage.as_dyn(), copies)
            }
        };
        let store = match store {
            Some(store) => store,
            None => open_store(&params)?,
        };
        let store = link_store(&params, store)?;
        let clock = clock.unwrap_or_else(|| match params.clock {
            ClockKind::Simulated => Box::new(SimClock),
            ClockKind::Wall => Box::new(WallClock::new()),
        });
        let groups = GroupCoordinator::new(&params.geometry)?;
        let layout =
            GroupCoordinator::layout(&params.geometry, u64::from(params.sim_bytes_per_page));
        let policy = restore_policy::for_params(&params);
        Ok(Engine {
            scratch: StepScratch::new(params.sim_bytes_per_page as usize),
            params,
            executor,
            pool,
            storage,
            policy,
            groups,
            table: RequestTable::default(),
            restores: Restores::new(copies, store, layout),
            time: StepTime::new(clock),
            watchdog: Watchdog::default(),
            ids: Ids::default(),
            tally: Tally::default(),
            kv_events: None,
        })
    }
}

/// The store's capacity in payload bytes: `store_capacity_pages` simulated pages.
pub(super) fn store_capacity_bytes(params: &EngineParams) -> u64 {
    params
        .store_capacity_pages
        .saturating_mul(u64::from(params.sim_bytes_per_page))
}

/// The checkpoint store `params` asks for: a `RedisStore` at `store_url` (sharing what the server holds), a
/// `DiskStore` in `store_dir` (reopened with what it holds), else a `HostStore`.
pub fn open_store(params: &EngineParams) -> Result<Box<dyn CheckpointStore>> {
    let capacity = store_capacity_bytes(params);
    Ok(match (&params.store_url, &params.store_dir) {
        (Some(url), None) => Box::new(RedisStore::open(
            url,
            &params.store_key_prefix,
            capacity,
            params.lookup_timeout,
        )?),
        (Some(_), Some(_)) => {
            return Err(Error::InvalidParam {
                name: "store_url",
                reason: "store_dir is set too; give one checkpoint store".to_string(),
            });
        }
        (None, Some(dir)) => Box::new(DiskStore::open(dir, capacity)?),
        (None, None) => Box::new(HostStore::new(capacity)),
    })
}

/// How the engine reaches `store`: on the wall clock on a thread of its own, so that a slow or dead store
/// delays the restores that asked it and never a step; on the simulated clock inline, deterministic (its I/O
/// takes no simulated time).
pub(super) fn link_store(
    params: &EngineParams,
    store: Box<dyn CheckpointStore>,
) -> Result<StoreLink> {
    Ok(match params.clock {
        ClockKind::Wall => StoreLink::threaded(store)?,
        ClockKind::Simulated => StoreLink::inline(store),
    })
}

/// The page storage `params` asks for, before its use is decided: the cuda copy engine needs the
/// `CudaStorage` itself, everything else the `PageStorage` trait.
enum Storage {
    Host(Arc<HostStorage>),
    Cuda(Arc<CudaStorage>),
}

impl Storage {
    fn as_dyn(&self) -> Arc<dyn PageStorage> {
        match self {
            Storage::Host(host) => Arc::clone(host) as Arc<dyn PageStorage>,
            Storage::Cuda(cuda) => Arc::clone(cuda) as Arc<dyn PageStorage>,
        }
    }
}

/// The page storage `params` asks for (L1): `n_ranks` shards of `n_pages` pages of `sim_bytes_per_page`.
/// CUDA storage without a driver or device is `InvalidParam` naming `storage`, with the driver's reason.
fn open_storage(params: &EngineParams, n_ranks: u32, n_pages: u32) -> Result<Storage> {
    let bytes_per_page = params.sim_bytes_per_page as usize;
    Ok(match params.storage {
        StorageKind::Host => Storage::Host(Arc::new(HostStorage::new(
            n_ranks,
            n_pages,
            bytes_per_page,
        )?)),
        StorageKind::Cuda { device } => {
            match CudaStorage::new(device as usize, n_ranks, n_pages, bytes_per_page) {
                Ok(cuda) => Storage::Cuda(Arc::new(cuda)),
                Err(kv_pool::Error::CudaUnavailable { reason }) => {
                    return Err(Error::InvalidParam {
                        name: "storage",
                        reason: format!(
                            "cuda page storage on device {device} needs an NVIDIA driver and that device: \
                             {reason}; use host storage ([pool] storage = \"host\", --storage host) on a \
                             machine without one"
                        ),
                    });
                }
                Err(other) => return Err(other.into()),
            }
        }
    })
}

/// The modeled copy time the inline copy engine charges: the executor's, per page of `params`.
fn copy_model<E: Executor>(params: &EngineParams, executor: &E) -> CopyModel {
    let latency = executor.copy_time(0);
    let per_page = executor
        .copy_time(params.geometry.tokens_per_page())
        .saturating_sub(latency)
        .as_secs_f64()
        .max(1e-12);
    CopyModel {
        bandwidth_bytes_per_s: f64::from(params.sim_bytes_per_page) / per_page,
        latency,
    }
}

/// Checks storage given to `Builder::page_storage` has the pool's shape and its copy engine is idle.
fn check_given_page_bytes(
    params: &EngineParams,
    storage: &dyn PageStorage,
    copies: &dyn CopyEngine,
    n_ranks: u32,
    n_pages: u32,
) -> Result<()> {
    let bytes_per_page = params.sim_bytes_per_page as usize;
    let shape = (
        storage.n_ranks(),
        storage.n_pages(),
        storage.bytes_per_page(),
    );
    if shape != (n_ranks, n_pages, bytes_per_page) {
        return Err(Error::InvalidParam {
            name: "storage",
            reason: format!(
                "the given storage holds {} ranks of {} pages of {} bytes; the pool needs {n_ranks} \
                 of {n_pages} of {bytes_per_page}",
                shape.0, shape.1, shape.2
            ),
        });
    }
    if copies.n_in_flight() > 0 {
        return Err(Error::InvalidParam {
            name: "copy_engine",
            reason: format!(
                "the given copy engine has {} jobs in flight; give an idle one",
                copies.n_in_flight()
            ),
        });
    }
    Ok(())
}

/// The copy engine `params` asks for (L1), moving bytes into `storage`. `validate` refused cuda copies on
/// host storage already; the check here keeps the refusal an error should that change.
fn open_copy_engine(
    params: &EngineParams,
    model: CopyModel,
    storage: &Storage,
) -> Result<Box<dyn CopyEngine>> {
    let shared = storage.as_dyn();
    Ok(match params.copy_engine {
        CopyEngineKind::Inline => Box::new(InlineCopyEngine::with_storage(model, shared)),
        CopyEngineKind::Threaded { workers } => {
            Box::new(ThreadedCopyEngine::new(shared, workers as usize)?)
        }
        CopyEngineKind::Reordering { workers, seed } => {
            Box::new(ReorderingCopyEngine::new(shared, workers as usize, seed)?)
        }
        CopyEngineKind::Cuda => match storage {
            Storage::Cuda(cuda) => Box::new(CudaCopyEngine::new(Arc::clone(cuda))?),
            Storage::Host(_) => {
                return Err(Error::InvalidParam {
                    name: "copy_engine",
                    reason: "cuda copies write into CUDA page storage; set storage to cuda"
                        .to_string(),
                });
            }
        },
    })
}
