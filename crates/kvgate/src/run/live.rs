//! The live agents run (L1, L3): the reference model computing real KV and recurrent state into the pool's
//! pages (host or CUDA storage), threaded or CUDA copies moving real bytes from the host store while steps
//! run, on the wall clock. Sized
//! for a couple of cores: fewer, shorter sessions than the simulated run, a pool they still outgrow. With a
//! model preset, the reference model takes the preset's shape, scaled down (`reference_model`).

use engine::{ClockKind, CopyEngineKind, EngineParams, Policy, ReferenceExecutor, RunMetrics};
use kv_pool::GroupKind;
use reference_model::{LocalAttention, ReferenceConfig};

use std::time::Duration;

use super::{Observer, Progress, drive_agents};
use crate::builder::engine_builder;
use crate::config::{EngineConfig, model_preset};
use crate::error::{Error, Result};
use crate::model::{VerifyExcludedClock, VerifyTime, VerifyTimed};
use crate::workload::agents::AgentsSpec;

/// Usable pages of the live run's pool unless told otherwise, for the tiny model: 3 072 tokens of 16-token
/// pages, which eight live sessions of up to ~1 900 tokens outgrow about five times over by their last
/// turns. Other shapes: `live_pool_pages`.
pub(crate) const LIVE_POOL_PAGES: u32 = 192;
/// Sessions whose state and window pages a live pool holds besides its `LIVE_POOL_PAGES` pages of tokens.
const LIVE_POOL_SESSIONS: u32 = 4;
/// The sliding window of the `sliding-window` preset's live model, in tokens (the preset's is 1024: the live
/// sessions' contexts of 1-2k tokens would hardly leave it).
pub(crate) const LIVE_SLIDING_WINDOW_TOKENS: u32 = 256;
/// Longest context of the live run's model, in tokens.
pub(crate) const LIVE_MAX_MODEL_LEN: u32 = 4096;
/// Running slots of the live run (the `oracle` pool has room for each at the model's length).
pub(crate) const LIVE_MAX_RUNNING: u32 = 16;

/// The live run's sessions unless told otherwise: 8 sessions x 8 turns, 1024-token first prompts, 64 new
/// tokens and 48 response tokens a turn, 0.5 s think time (35 s wall for the four policies in a release build on 2 cores).
pub(crate) fn live_agents_spec() -> AgentsSpec {
    AgentsSpec {
        n_agents: 8,
        turns: 8,
        first_prompt_tokens: 1024,
        turn_input_tokens: 64,
        response_tokens: 48,
        think_s: 0.5,
        seed: 1,
        ..AgentsSpec::default()
    }
}

/// The reference model of a live run: the tiny model with the run's seed, in the shape of the model preset
/// `config` names, scaled down (the tiny model's widths; the preset's page width unless noted):
/// `glm-mla-hybrid`, one full-attention group (plain keys and values, not an MLA latent), three recurrent
/// groups of one layer and two context-parallel ranks, with 16-token pages where the preset has 64;
/// `linear-hybrid`, a full-attention layer and a recurrent group of three layers; `sliding-window`, a
/// full-attention layer and two sliding-window layers of `LIVE_SLIDING_WINDOW_TOKENS` tokens. The tiny
/// model itself otherwise.
pub fn reference_model(config: &EngineConfig) -> ReferenceConfig {
    let tiny = ReferenceConfig {
        seed: config.seed,
        ..ReferenceConfig::tiny()
    };
    match model_preset(&config.model.preset).map(|preset| preset.name) {
        Some("glm-mla-hybrid") => ReferenceConfig {
            n_recurrent_groups: 3,
            context_parallel: 2,
            ..tiny
        },
        Some("linear-hybrid") => ReferenceConfig {
            n_attention_layers: 1,
            n_recurrent_layers: 3,
            ..tiny
        },
        Some("sliding-window") => ReferenceConfig {
            n_attention_layers: 1,
            local: Some(LocalAttention {
                n_layers: 2,
                window: GroupKind::SlidingWindow {
                    window_tokens: LIVE_SLIDING_WINDOW_TOKENS,
                    retained_tail_tokens: 0,
                },
            }),
            n_recurrent_layers: 0,
            ..tiny
        },
        _ => tiny,
    }
}

/// Usable pages of a live run's pool for `model` unless told otherwise: `LIVE_POOL_PAGES` 16-token pages'
/// worth of tokens in the model's blocks, plus the state pages and live window pages of
/// `LIVE_POOL_SESSIONS` sessions (`LIVE_POOL_PAGES` for the tiny model).
pub(crate) fn live_pool_pages(model: &ReferenceConfig) -> u32 {
    let block_tokens = model.block_tokens().max(1);
    let tokens = LIVE_POOL_PAGES * 16;
    let window_pages = model.local.map_or(0, |local| match local.window {
        GroupKind::SlidingWindow { window_tokens, .. } => window_tokens.div_ceil(block_tokens) + 1,
        GroupKind::ChunkedLocal { chunk_tokens } => chunk_tokens.div_ceil(block_tokens),
        // A validated model's local group is one of the two above.
        GroupKind::Full | GroupKind::Recurrent | GroupKind::Auxiliary { .. } => 0,
    });
    let state_pages = model.n_state_pages() as u32;
    let extra = if model.local.is_none() && state_pages <= 1 {
        0
    } else {
        LIVE_POOL_SESSIONS * (window_pages + state_pages)
    };
    tokens.div_ceil(block_tokens) + extra
}

/// The engine parameters of a live run of `policy`: `config`'s, on the reference model's geometry
/// (`reference_model`: its groups, page width and ranks, `LIVE_MAX_MODEL_LEN` tokens; a model preset's draft
/// tokens, which the reference model leaves unused, so no draft is accepted) and the wall clock; its copy engine, except that
/// `inline` (modeled time) becomes `threaded`, since a live run copies real bytes while steps run; its page
/// storage (`cuda` with the cuda copy engine: the restores go straight into device pages). Errors: anything
/// `engine_params` refuses.
pub(crate) fn live_params(config: &EngineConfig, policy: Policy) -> Result<EngineParams> {
    check_live_geometry(config)?;
    let model = reference_model(config);
    let preset = model_preset(&config.model.preset);
    let mut config = config.clone();
    config.model.max_model_len = LIVE_MAX_MODEL_LEN;
    config.scheduler.max_running = config.scheduler.max_running.min(LIVE_MAX_RUNNING);
    let mut params = config.engine_params(policy)?;
    params.geometry = model
        .geometry(LIVE_MAX_MODEL_LEN)
        .map_err(engine::Error::from)?;
    params.draft_tokens = preset.map_or(0, |preset| preset.draft_tokens);
    // The reference model has no draft head: it rejects every draft, whatever the preset's acceptance.
    params.draft_acceptance = 0.0;
    params.clock = ClockKind::Wall;
    if params.copy_engine == CopyEngineKind::Inline {
        params.copy_engine = CopyEngineKind::Threaded {
            workers: config.restore.copy_workers,
        };
    }
    Ok(params)
}

/// Refuses a config that sets a geometry the reference model does not run: a live run takes its cache groups,
/// page width and ranks from the reference model (`reference_model`), so `model.groups`,
/// `model.tokens_per_page` and `model.context_parallel` must be what `model.preset` gives (the defaults, or a
/// model preset's); anything else would be silently ignored. Errors: `InvalidConfig` naming the field.
pub(crate) fn check_live_geometry(config: &EngineConfig) -> Result<()> {
    let mut expected = EngineConfig::default();
    expected.apply_preset(&config.model.preset)?;
    let (model, expected) = (&config.model, &expected.model);
    let differs = [
        (
            "model.groups",
            model.groups != expected.groups,
            format!("{} group(s)", model.groups.len()),
        ),
        (
            "model.tokens_per_page",
            model.tokens_per_page != expected.tokens_per_page,
            model.tokens_per_page.to_string(),
        ),
        (
            "model.context_parallel",
            model.context_parallel != expected.context_parallel,
            model.context_parallel.to_string(),
        ),
    ];
    match differs.into_iter().find(|(_, differs, _)| *differs) {
        Some((field, _, value)) => Err(Error::InvalidConfig {
            field,
            value,
            allowed: "what model.preset gives: a live run (--executor reference) runs the reference \
                      model's own geometry, or a model preset's shape scaled down; remove the field, or \
                      name a model preset"
                .to_string(),
        }),
        None => Ok(()),
    }
}

/// The executor of a live reference run: the reference model, its restore verification timed apart.
pub type LiveReference = VerifyTimed<ReferenceExecutor>;

/// Runs the agents workload live under `policy` (see the module docs) until every turn has finished, with
/// `observer` shown every step while the run goes on (a metrics exporter serves what it records as the run
/// progresses) and once at the end, before the engine shuts down. The clock leaves out the time `--verify`
/// spends recomputing restores; that time is returned beside the metrics.
pub fn run_agents_live_observed(
    config: &EngineConfig,
    spec: &AgentsSpec,
    policy: Policy,
    progress: Progress<'_>,
    observer: &mut dyn Observer<LiveReference>,
) -> Result<(RunMetrics, Duration)> {
    spec.validate_live()?;
    let params = live_params(config, policy)?;
    let verify = VerifyTime::default();
    let executor = VerifyTimed::new(
        ReferenceExecutor::new(reference_model(config))?,
        verify.clone(),
    );
    let mut engine = engine_builder(config, params, executor, None)?
        .clock(Box::new(VerifyExcludedClock::new(verify.clone())))
        .build()?;
    drive_agents(&mut engine, spec, progress, &mut |engine, report| {
        observer.step(engine, report);
        !observer.stop()
    })?;
    observer.finish(&engine);
    let _shutdown = engine.shutdown()?;
    Ok((engine.metrics(), verify.total()))
}
