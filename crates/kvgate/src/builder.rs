//! The `EngineBuilder`: how an embedding server makes an engine from an `EngineConfig` (through the engine's
//! own `Engine::builder`, the one way any engine is made).

use engine::{Engine, Policy};

use crate::config::EngineConfig;
use crate::error::Result;
use crate::metrics::{EngineMetrics, MetricFamilies};

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
        Ok(Engine::builder(self.config.engine_params(self.policy)?))
    }

    /// `build`, with the engine's Prometheus metrics registered in `registry` (labelled with the policy):
    /// show the returned `EngineMetrics` every `StepReport` (`Observer::step`) and serve the registry, for
    /// example with `metrics::serve`.
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
