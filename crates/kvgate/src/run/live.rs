//! The live agents run (L1, L3): the reference model computing real KV and recurrent state into the pool's
//! pages (host or CUDA storage), threaded or CUDA copies moving real bytes from the host store while steps
//! run, on the wall clock. Sized
//! for a couple of cores: fewer, shorter sessions than the simulated run, a pool they still outgrow.

use engine::{
    ClockKind, CopyEngineKind, Engine, EngineParams, Policy, ReferenceConfig, ReferenceExecutor,
    RunMetrics,
};
use kv_pool::Geometry;

use super::{NoObserver, Observer, Progress, drive_agents};
use crate::config::{EngineConfig, model_preset};
use crate::error::{Error, Result};
use crate::workload::agents::AgentsSpec;

/// Usable pages of the live run's pool unless told otherwise: 3 072 tokens of 16-token pages, which eight
/// live sessions of up to ~1 900 tokens outgrow about five times over by their last turns.
pub const LIVE_POOL_PAGES: u32 = 192;
/// Longest context of the live run's model, in tokens.
pub const LIVE_MAX_MODEL_LEN: u32 = 4096;
/// Running slots of the live run (the `oracle` pool has room for each at the model's length).
pub const LIVE_MAX_RUNNING: u32 = 16;

/// The live run's sessions unless told otherwise: 8 sessions x 8 turns, 1024-token first prompts, 64 new
/// tokens and 48 response tokens a turn, 0.5 s think time (about 15 s on 2 cores).
pub fn live_agents_spec() -> AgentsSpec {
    AgentsSpec {
        n_agents: 8,
        turns: 8,
        first_prompt_tokens: 1024,
        turn_input_tokens: 64,
        response_tokens: 48,
        think_s: 0.5,
        seed: 1,
    }
}

/// The reference model of a live run: the tiny model with the run's seed.
pub fn reference_model(config: &EngineConfig) -> ReferenceConfig {
    ReferenceConfig {
        seed: config.seed,
        ..ReferenceConfig::tiny()
    }
}

/// The engine parameters of a live run of `policy`: `config`'s, on the model's own geometry (one rank,
/// its page width, `LIVE_MAX_MODEL_LEN` tokens) and the wall clock; its copy engine, except that `inline`
/// (modeled time) becomes `threaded`, since a live run copies real bytes while steps run; its page
/// storage (`cuda` with the cuda copy engine: the restores go straight into device pages). Errors: a
/// model preset in `config` (its geometry is not the reference model's), and anything `engine_params`
/// refuses.
pub fn live_params(config: &EngineConfig, policy: Policy) -> Result<EngineParams> {
    if model_preset(&config.model.preset).is_some() {
        return Err(Error::InvalidArgument {
            name: "--executor",
            value: format!("reference with model preset {}", config.model.preset),
            allowed: "the reference executor runs its own model's geometry; drop the model preset or use \
                      --executor sim",
        });
    }
    let model = reference_model(config);
    let mut config = config.clone();
    config.model.max_model_len = LIVE_MAX_MODEL_LEN;
    config.scheduler.max_running = config.scheduler.max_running.min(LIVE_MAX_RUNNING);
    let mut params = config.engine_params(policy)?;
    params.geometry = Geometry::new(
        model.cache_groups(),
        model.tokens_per_page,
        1,
        LIVE_MAX_MODEL_LEN,
    )
    .map_err(engine::Error::from)?;
    params.draft_tokens = 0;
    params.clock = ClockKind::Wall;
    if params.copy_engine == CopyEngineKind::Inline {
        params.copy_engine = CopyEngineKind::Threaded {
            workers: config.restore.copy_workers,
        };
    }
    Ok(params)
}

/// Runs the agents workload live under `policy` (see the module docs) until every turn has finished.
pub fn run_agents_live(
    config: &EngineConfig,
    spec: &AgentsSpec,
    policy: Policy,
    progress: Progress<'_>,
) -> Result<RunMetrics> {
    run_agents_live_observed(config, spec, policy, progress, &mut NoObserver)
}

/// `run_agents_live`, with `observer` shown every step while the run goes on (a metrics exporter serves
/// what it records as the run progresses) and once at the end, before the engine shuts down.
pub fn run_agents_live_observed(
    config: &EngineConfig,
    spec: &AgentsSpec,
    policy: Policy,
    progress: Progress<'_>,
    observer: &mut dyn Observer<ReferenceExecutor>,
) -> Result<RunMetrics> {
    spec.validate()?;
    let params = live_params(config, policy)?;
    let executor = ReferenceExecutor::new(reference_model(config))?;
    let mut engine = Engine::with_executor(params, executor)?;
    drive_agents(&mut engine, spec, progress, &mut |engine, report| {
        observer.step(engine, report);
    })?;
    observer.finish(&engine);
    let _shutdown = engine.shutdown()?;
    Ok(engine.metrics())
}
