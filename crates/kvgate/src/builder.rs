//! The `EngineBuilder`: how an embedding server makes an engine from an `EngineConfig` (through the engine's
//! own `Engine::builder`, the one way any engine is made), and where the infrastructure a configuration names
//! is opened: a Redis or disk checkpoint store (`[store]`) and CUDA page storage with its copies (`[pool]
//! storage`, `[restore] copy_engine`). The engine opens none of them; it takes them as trait objects.

use std::sync::Arc;

use checkpoint_transfer::{CheckpointStore, CudaCopyEngine, DiskStore, HostStore, RedisStore};
use engine::{Engine, EngineParams, Executor, Policy, SimExecutor};
use kv_pool::CudaStorage;

use crate::config::EngineConfig;
use crate::error::Result;
use crate::prometheus::{EngineMetrics, MetricFamilies};

/// Builds an [`Engine`] from a validated [`EngineConfig`] and a policy (default `reserved`).
///
/// ```
/// use kvgate::{EngineBuilder, EngineConfig, Policy};
///
/// let engine = EngineBuilder::new(EngineConfig::default()).policy(Policy::Reserved).build().unwrap();
/// assert!(engine.is_idle());
/// ```
#[derive(Clone, Debug)]
pub struct EngineBuilder {
    config: EngineConfig,
    policy: Policy,
}

impl EngineBuilder {
    /// A builder for `config` under the `reserved` policy.
    pub fn new(config: EngineConfig) -> EngineBuilder {
        EngineBuilder {
            config,
            policy: Policy::Reserved,
        }
    }

    /// Chooses the admission policy.
    pub fn policy(mut self, policy: Policy) -> EngineBuilder {
        self.policy = policy;
        self
    }

    /// Sets the run's seed.
    pub fn seed(mut self, seed: u64) -> EngineBuilder {
        self.config.seed = seed;
        self
    }

    /// The configuration the engine will be built from.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Validates the configuration and builds the engine; errors name the field at fault.
    pub fn build(self) -> Result<Engine> {
        Ok(self.engine()?.build()?)
    }

    /// Validates the configuration and gives the engine's own builder (`engine::Builder`), for the parts a
    /// caller supplies itself: an executor, a shared checkpoint store, page storage, a clock.
    pub fn engine(self) -> Result<engine::Builder> {
        let params = self.config.engine_params(self.policy)?;
        let executor = SimExecutor::new(params.cost.clone());
        engine_builder(&self.config, params, executor, None)
    }

    /// `build`, with the engine's Prometheus metrics registered in `registry` (labelled with the policy):
    /// show the returned `EngineMetrics` every `StepReport` (`Observer::step`) and serve the registry, for
    /// example with `prometheus::serve`.
    pub fn build_with_metrics(
        self,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<(Engine, EngineMetrics)> {
        let policy = self.policy;
        let engine = self.build()?;
        let metrics = MetricFamilies::register(registry).engine(policy.name());
        Ok((engine, metrics))
    }
}

/// `Engine::builder(params)` driving `executor`, with the page storage `config` names opened for it, and
/// `store`, or else the checkpoint store `config` names (`params` derived from `config`; a driver may have
/// changed fields the infrastructure does not read). An executor with pages of its own size (a real model)
/// sizes the store and the storage.
pub(crate) fn engine_builder<E: Executor>(
    config: &EngineConfig,
    mut params: EngineParams,
    executor: E,
    store: Option<Box<dyn CheckpointStore>>,
) -> Result<engine::Builder<E>> {
    if let Some(bytes_per_page) = executor.bytes_per_page() {
        params.page_bytes = bytes_per_page;
    }
    let store = match store {
        Some(store) => store,
        None => open_store(config, &params)?,
    };
    let device = open_cuda_storage(config, &params)?;
    let builder = Engine::builder(params).executor(executor).store(store);
    Ok(match device {
        None => builder,
        Some(storage) if config.cuda_copies() => {
            let copies = CudaCopyEngine::new(Arc::clone(&storage)).map_err(engine::Error::from)?;
            builder.page_storage(storage, Box::new(copies))
        }
        Some(storage) => builder.storage(storage),
    })
}

/// The checkpoint store `config` names, of `params.store_capacity_bytes()`: a `RedisStore` at `store.url`
/// (sharing what the server holds), a `DiskStore` in `store.dir` (reopened with what it holds), else a
/// `HostStore`. `EngineConfig::validate` refused both at once.
pub(crate) fn open_store(
    config: &EngineConfig,
    params: &EngineParams,
) -> Result<Box<dyn CheckpointStore>> {
    let capacity = params.store_capacity_bytes();
    let store = &config.store;
    Ok(match (&store.url, &store.dir) {
        (Some(url), _) => Box::new(
            RedisStore::open(url, &store.key_prefix, capacity, params.lookup_timeout)
                .map_err(engine::Error::from)?,
        ),
        (None, Some(dir)) => Box::new(DiskStore::open(dir, capacity).map_err(engine::Error::from)?),
        (None, None) => Box::new(HostStore::new(capacity)),
    })
}

/// The CUDA page storage `[pool] storage = "cuda"` names, shaped as `params`' pool, or `None` for host
/// storage (the engine's own). Without a driver or that device: `InvalidParam` naming `storage`, with the
/// driver's reason and what to do.
fn open_cuda_storage(
    config: &EngineConfig,
    params: &EngineParams,
) -> Result<Option<Arc<CudaStorage>>> {
    let Some(device) = config.cuda_device() else {
        return Ok(None);
    };
    let opened = CudaStorage::new(
        device as usize,
        params.geometry.context_parallel(),
        params.pool_pages(),
        params.page_bytes as usize,
    );
    match opened {
        Ok(cuda) => Ok(Some(Arc::new(cuda))),
        Err(kv_pool::Error::CudaUnavailable { reason }) => Err(engine::Error::InvalidParam {
            name: "storage",
            reason: format!(
                "cuda page storage on device {device} needs an NVIDIA driver and that device: {reason}; \
                 use host storage ([pool] storage = \"host\", --storage host) on a machine without one"
            ),
        }
        .into()),
        Err(other) => Err(engine::Error::from(other).into()),
    }
}
