//! How an engine is made (`Engine::builder`, the one way): its parameters, then the parts its caller opens
//! (the executor, the checkpoint store, the page bytes and copy engine, the clock). The engine opens no
//! infrastructure itself: without a given part it uses host memory (a `HostStore`, `HostStorage`) and the
//! copy engine `copy_engine` names; a Redis or disk store and device memory are opened by the caller (the
//! `kvgate` facade's `EngineBuilder` does, from its configuration) and given here.

use std::sync::Arc;

use checkpoint_transfer::{
    CheckpointStore, CopyEngine, CopyModel, HostStore, InlineCopyEngine, ReorderingCopyEngine,
    StoreLink, ThreadedCopyEngine,
};
use kv_pool::{HostStorage, PagePool, PageStorage};

use super::groups::GroupCoordinator;
use super::parts::{Ids, Restores, StepScratch, StepTime, Tally, Watchdog};
use super::restore_policy;
use super::table::RequestTable;
use super::{Clock, Engine, SimClock, WallClock};
use crate::error::{Error, Result};
use crate::executor::{Executor, SimExecutor};
use crate::params::{ClockKind, CopyEngineKind, EngineParams};

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
    page_bytes: Option<GivenStorage>,
    clock: Option<Box<dyn Clock>>,
}

/// Page storage given to the builder, with the copy engine that writes into it (`page_storage`) or without
/// (`storage`: the engine opens the one `copy_engine` names).
type GivenStorage = (Arc<dyn PageStorage>, Option<Box<dyn CopyEngine>>);

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
    /// `page_bytes` to it; it checks the rest of the parameters itself (`Executor::check_params`).
    pub fn executor<F: Executor>(self, executor: F) -> Builder<F> {
        Builder {
            params: self.params,
            executor,
            store: self.store,
            page_bytes: self.page_bytes,
            clock: self.clock,
        }
    }

    /// Puts checkpoints in `store` instead of a `HostStore` of `store_capacity_pages` pages: a Redis or disk
    /// store, or a `SharedStore` (engines built with clones of one restore each other's checkpoints).
    pub fn store(mut self, store: Box<dyn CheckpointStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Keeps page bytes in `storage` and restores through `copies` instead of host storage and the copy
    /// engine `copy_engine` names: device memory with its own copy engine, or a stand-in device whose copies
    /// a test holds in flight. `copies` must write into `storage` and have nothing in flight; `build` refuses
    /// otherwise (`InvalidParam` naming `storage` when its shape is not the pool's, `context_parallel` ranks
    /// of `pool_pages()` pages of `page_bytes` bytes, or `copy_engine` when `copies` has jobs).
    pub fn page_storage(
        mut self,
        storage: Arc<dyn PageStorage>,
        copies: Box<dyn CopyEngine>,
    ) -> Self {
        self.page_bytes = Some((storage, Some(copies)));
        self
    }

    /// Keeps page bytes in `storage` (device memory) instead of host storage; restores go through the copy
    /// engine `copy_engine` names, writing into it through `PageStorage`. `build` refuses storage whose shape
    /// is not the pool's, as `page_storage` does.
    pub fn storage(mut self, storage: Arc<dyn PageStorage>) -> Self {
        self.page_bytes = Some((storage, None));
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
            params.page_bytes = bytes_per_page;
        }
        params.validate()?;
        executor.check_params(&params)?;
        let n_ranks = params.geometry.context_parallel();
        let n_pages = params.pool_pages();
        let pool = PagePool::new(n_pages)?;
        // One shard per rank: a page id names that page on every rank (`Geometry::block_tokens`).
        let model = copy_model(&params, &executor);
        let (storage, copies) = match page_bytes {
            Some((storage, copies)) => {
                check_given_storage(&params, &*storage, n_ranks, n_pages)?;
                let copies = match copies {
                    Some(copies) => check_idle(copies)?,
                    None => open_copy_engine(&params, model, &storage)?,
                };
                (storage, copies)
            }
            None => {
                let storage: Arc<dyn PageStorage> = Arc::new(HostStorage::new(
                    n_ranks,
                    n_pages,
                    params.page_bytes as usize,
                )?);
                let copies = open_copy_engine(&params, model, &storage)?;
                (storage, copies)
            }
        };
        let store =
            store.unwrap_or_else(|| Box::new(HostStore::new(params.store_capacity_bytes())));
        let page_content_read = params.verify_restores || store.outlives_the_process();
        let store = link_store(&params, store)?;
        let clock = clock.unwrap_or_else(|| match params.clock {
            ClockKind::Simulated => Box::new(SimClock),
            ClockKind::Wall => Box::new(WallClock::new()),
        });
        let groups = GroupCoordinator::new(&params.geometry)?;
        let layout = GroupCoordinator::layout(&params.geometry, u64::from(params.page_bytes));
        let policy = restore_policy::for_params(&params);
        Ok(Engine {
            scratch: StepScratch::new(params.page_bytes as usize),
            params,
            executor,
            pool,
            storage,
            policy,
            groups,
            table: RequestTable::default(),
            restores: Restores::new(copies, store, layout, page_content_read),
            time: StepTime::new(clock),
            watchdog: Watchdog::default(),
            ids: Ids::default(),
            tally: Tally::default(),
            kv_events: None,
            snapshots: super::snapshots::Snapshots::default(),
        })
    }
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

/// The modeled copy time the inline copy engine charges: the executor's, per page of `params`.
fn copy_model<E: Executor>(params: &EngineParams, executor: &E) -> CopyModel {
    let latency = executor.copy_time(0);
    let per_page = executor
        .copy_time(params.geometry.tokens_per_page())
        .saturating_sub(latency)
        .as_secs_f64()
        .max(1e-12);
    CopyModel {
        bandwidth_bytes_per_s: f64::from(params.page_bytes) / per_page,
        latency,
    }
}

/// Checks storage given to `Builder::page_storage` or `Builder::storage` has the pool's shape.
fn check_given_storage(
    params: &EngineParams,
    storage: &dyn PageStorage,
    n_ranks: u32,
    n_pages: u32,
) -> Result<()> {
    let bytes_per_page = params.page_bytes as usize;
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
    Ok(())
}

/// A copy engine given to `Builder::page_storage`, refused while it has jobs in flight.
fn check_idle(copies: Box<dyn CopyEngine>) -> Result<Box<dyn CopyEngine>> {
    if copies.n_in_flight() > 0 {
        return Err(Error::InvalidParam {
            name: "copy_engine",
            reason: format!(
                "the given copy engine has {} jobs in flight; give an idle one",
                copies.n_in_flight()
            ),
        });
    }
    Ok(copies)
}

/// The copy engine `params` asks for (L1), moving bytes into `storage`.
fn open_copy_engine(
    params: &EngineParams,
    model: CopyModel,
    storage: &Arc<dyn PageStorage>,
) -> Result<Box<dyn CopyEngine>> {
    let shared = Arc::clone(storage);
    Ok(match params.copy_engine {
        CopyEngineKind::Inline => Box::new(InlineCopyEngine::with_storage(model, shared)),
        CopyEngineKind::Threaded { workers } => {
            Box::new(ThreadedCopyEngine::new(shared, workers as usize)?)
        }
        CopyEngineKind::Reordering { workers, seed } => {
            Box::new(ReorderingCopyEngine::new(shared, workers as usize, seed)?)
        }
    })
}
