//! What the command line and the Python package share around a run, so that the same options make the same
//! run and the same report: the run options and the config they make (`load_config`), the agents workload
//! (`agents_spec`), the checkpoint stores at start, and the header fields a report carries beside its runs
//! (`AgentsHeader`, `replay_header_json`).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::report;
use crate::run::{self, StoreAtStart};
use crate::workload::agents::{AgentsSpec, TurnPriority};
use crate::workload::mooncake::{self, TraceRequest};
use engine::{Policy, RunMetrics};

/// Where a run's config comes from: a TOML file (`--config FILE`) or a table of the same sections.
#[derive(Clone, Debug)]
pub enum ConfigSource {
    File(PathBuf),
    Table(toml::Table),
}

/// The options every run takes (the command line's shared flags; the Python functions' keywords).
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub config: Option<ConfigSource>,
    pub pool_pages: Option<u32>,
    pub store_pages: Option<u64>,
    pub preset: Option<String>,
    pub seed: Option<u64>,
    pub preemption: Option<String>,
    pub storage: Option<String>,
    pub copy_engine: Option<String>,
    /// A calibrated step-time model file (`--cost-model`), priced for the config's preset.
    pub cost_model: Option<std::path::PathBuf>,
    pub verify: bool,
}

/// The config of a run: the file's or table's (or the default; the environment's override of the restore
/// wait applies), the options applied and validated; and whether the options or the config set the pool's
/// pages (a run that sizes its own pool does so only where they did not).
pub fn load_config(options: &RunOptions) -> Result<(EngineConfig, bool)> {
    let (mut config, mut pool_pages_set) = match &options.config {
        Some(ConfigSource::File(path)) => {
            let file = EngineConfig::load_file(path)?;
            let set = file.sets("pool", "pages");
            (file.config, set)
        }
        Some(ConfigSource::Table(table)) => {
            let set = table
                .get("pool")
                .and_then(toml::Value::as_table)
                .is_some_and(|pool| pool.contains_key("pages"));
            let config = EngineConfig::from_toml(&table.to_string())?.with_env_overrides()?;
            (config, set)
        }
        None => (EngineConfig::default().with_env_overrides()?, false),
    };
    if let Some(pages) = options.pool_pages {
        config.pool.pages = pages;
        pool_pages_set = true;
    }
    if let Some(storage) = &options.storage {
        storage.clone_into(&mut config.pool.storage);
    }
    if let Some(copy_engine) = &options.copy_engine {
        copy_engine.clone_into(&mut config.restore.copy_engine);
    }
    if let Some(pages) = options.store_pages {
        config.store.capacity_pages = pages;
    }
    if let Some(preset) = &options.preset {
        // A model preset replaces the model's geometry and draft depth, whatever the config said.
        config.apply_preset(preset)?;
    }
    if let Some(path) = &options.cost_model {
        let file = crate::fidelity::step_model::CostModelFile::load(path)?;
        config.calibrated_cost = Some(crate::fidelity::target::calibrated(
            &file,
            &path.display().to_string(),
            config.cost_preset(),
        )?);
    }
    if options.verify {
        config.restore.verify = true;
    }
    if let Some(seed) = options.seed {
        config.seed = seed;
    }
    if let Some(preemption) = &options.preemption {
        config.scheduler.preemption.clone_from(preemption);
    }
    config.validate()?;
    Ok((config, pool_pages_set))
}

/// The policies named, all four (`Policy::ALL`) when none is.
pub fn policies(names: &[String]) -> Result<Vec<Policy>> {
    if names.is_empty() {
        return Ok(Policy::ALL.to_vec());
    }
    names
        .iter()
        .map(|name| name.parse::<Policy>().map_err(Error::from))
        .collect()
}

/// The config of `policy`'s engine: its disk store in `<store.dir>/<policy>` and its Redis keys under
/// `<store.key_prefix><policy>:`, whether it runs alone or beside others, since one directory holds one
/// engine's checkpoints and a policy restoring another's would not compare policies.
pub fn config_of(config: &EngineConfig, policy: Policy) -> EngineConfig {
    config.for_one_of_several(policy)
}

/// Each policy's checkpoint store as its engine will open it, and what it holds now.
pub type Stores = Vec<(String, StoreAtStart)>;

/// The checkpoint store each policy's engine will open, and what it holds now (`run::store_at_start`).
pub fn stores_at_start(config: &EngineConfig, policies: &[Policy]) -> Result<Stores> {
    policies
        .iter()
        .map(|&policy| {
            let store = run::store_at_start(&config_of(config, policy), policy)?;
            Ok((policy.name().to_string(), store))
        })
        .collect()
}

/// The stores of a report's JSON: each policy's store.
pub(crate) fn stores_json(stores: &[(String, StoreAtStart)]) -> Value {
    let by_policy: serde_json::Map<String, Value> = stores
        .iter()
        .map(|(policy, store)| (policy.clone(), json!(store)))
        .collect();
    Value::Object(by_policy)
}

/// " on each of N ranks" for a pool of `context_parallel` ranks above 1, else nothing.
pub fn ranks_suffix(context_parallel: u32) -> String {
    if context_parallel > 1 {
        format!(" on each of {context_parallel} ranks")
    } else {
        String::new()
    }
}

/// The options of an agents run beyond the shared ones; `None` takes the workload's default.
#[derive(Clone, Debug, Default)]
pub struct AgentsOptions {
    pub agents: Option<u32>,
    pub turns: Option<u32>,
    pub think_s: Option<f64>,
    pub turn_priority: TurnPriority,
}

/// The agents workload of `options`, checked, on `config` (`load_config`'s), whose pool becomes the agents
/// run's own (`run::agents_pool_pages`, or a live run's) unless `pool_pages_set`.
pub fn agents_spec(
    config: &mut EngineConfig,
    pool_pages_set: bool,
    options: &AgentsOptions,
    live: bool,
) -> Result<AgentsSpec> {
    if !pool_pages_set {
        config.pool.pages = if live {
            run::live_pool_pages(&run::reference_model(config))
        } else {
            run::agents_pool_pages(config)
        };
    }
    let defaults = if live {
        run::live_agents_spec()
    } else {
        AgentsSpec::default()
    };
    let spec = AgentsSpec {
        n_agents: options.agents.unwrap_or(defaults.n_agents),
        turns: options.turns.unwrap_or(defaults.turns),
        think_s: options.think_s.unwrap_or(defaults.think_s),
        seed: run::agents_seed(config),
        turn_priority: options.turn_priority,
        ..defaults
    };
    if live {
        spec.validate_live()?;
        run::check_live_geometry(config)?;
    } else {
        spec.validate()?;
    }
    Ok(spec)
}

/// What an agents report says above its table: the workload, the pool, the preset, the seed and the stores.
#[derive(Debug, Clone)]
pub struct AgentsHeader {
    pub spec: AgentsSpec,
    pub pool_pages: u32,
    pub seed: u64,
    /// The pages' tokens and ranks: the reference model's in a live run (a preset's shape, scaled down).
    pub tokens_per_page: u32,
    pub context_parallel: u32,
    pub preset_label: String,
    pub stores: Stores,
}

impl AgentsHeader {
    /// The header of `spec` run on `config` (live: on the reference executor), its stores `stores`.
    pub fn new(config: &EngineConfig, spec: &AgentsSpec, live: bool, stores: Stores) -> Self {
        let model = run::reference_model(config);
        let (tokens_per_page, context_parallel) = if live {
            (model.tokens_per_page, model.context_parallel)
        } else {
            (config.model.tokens_per_page, config.model.context_parallel)
        };
        let preset_label = match (live, crate::config::model_preset(&config.model.preset)) {
            (false, _) => config.preset_label(),
            (true, None) => {
                "none: the reference executor, live on the wall clock (decode tok/s measured)"
                    .to_owned()
            }
            (true, Some(preset)) => format!(
                "{} on the reference executor (its shape scaled down), live on the wall clock (decode \
                 tok/s measured)",
                preset.name
            ),
        };
        AgentsHeader {
            spec: spec.clone(),
            pool_pages: config.pool.pages,
            seed: config.seed,
            tokens_per_page,
            context_parallel,
            preset_label,
            stores,
        }
    }

    /// Whether any engine's store held checkpoints of earlier runs: then the workload's ceiling on prompt
    /// tokens from cache does not hold.
    pub fn warm(&self) -> bool {
        self.stores.iter().any(|(_, store)| store.warm())
    }

    /// The header as the table's first lines.
    pub fn text(&self) -> String {
        let spec = &self.spec;
        let ceiling = if self.warm() {
            format!(
                "the store started warm, so the workload's ceiling of {:.1}% from cache (a cold store's) does not \
                 apply",
                spec.max_from_cache_pct()
            )
        } else {
            format!(
                "the workload allows at most {:.1}% from cache",
                spec.max_from_cache_pct()
            )
        };
        format!(
            "{} agents x {} turns ({} first-prompt tokens, about {} new tokens and {} response tokens a turn), \
             pool {} pages of {} tokens{}, preset {}, seed {}{}; {ceiling}\n{}",
            spec.n_agents,
            spec.turns,
            spec.first_prompt_tokens,
            spec.turn_input_tokens,
            spec.response_tokens,
            self.pool_pages,
            self.tokens_per_page,
            ranks_suffix(self.context_parallel),
            self.preset_label,
            self.seed,
            match spec.turn_priority {
                TurnPriority::Arrival => "",
                TurnPriority::Progress =>
                    ", turns admitted by session progress (--turn-priority progress)",
            },
            run::describe_stores(&self.stores),
        )
    }

    /// The same as top-level JSON fields beside `runs`.
    pub fn json(&self) -> Vec<(&'static str, Value)> {
        let spec = &self.spec;
        vec![
            ("agents", json!(spec.n_agents)),
            ("turns", json!(spec.turns)),
            ("first_prompt_tokens", json!(spec.first_prompt_tokens)),
            ("pool_pages", json!(self.pool_pages)),
            ("tokens_per_page", json!(self.tokens_per_page)),
            ("context_parallel", json!(self.context_parallel)),
            ("preset", json!(self.preset_label)),
            ("seed", json!(self.seed)),
            ("turn_priority", json!(spec.turn_priority)),
            (
                "max_from_cache_pct",
                json!((spec.max_from_cache_pct() * 1000.0).round() / 1000.0),
            ),
            ("store_started_warm", json!(self.warm())),
            ("stores", stores_json(&self.stores)),
        ]
    }
}

/// The top-level JSON fields of a replay report beside its `runs` (one engine a policy): whether each
/// engine kept up with the trace's arrivals (stretched `time_scale` times), the trace's ceiling on cache
/// hits, the trace, the pool, the preset, the seed and the stores.
pub fn replay_header_json(
    runs: &[RunMetrics],
    trace: &[TraceRequest],
    time_scale: f64,
    config: &EngineConfig,
    stores: &[(String, StoreAtStart)],
) -> Vec<(&'static str, Value)> {
    let max_hit_pct = mooncake::theoretical_max_hit_pct(trace);
    let last_s = trace
        .iter()
        .map(|r| r.timestamp)
        .max()
        .map_or(0.0, |ms| ms as f64 / 1000.0 * time_scale);
    let warm = stores.iter().any(|(_, store)| store.warm());
    vec![
        ("keep_up", report::replay_keep_up_json(runs, last_s)),
        (
            "theoretical_max_hit_pct",
            json!((max_hit_pct * 1000.0).round() / 1000.0),
        ),
        ("requests", json!(trace.len())),
        ("time_scale", json!(time_scale)),
        ("pool_pages", json!(config.pool.pages)),
        ("tokens_per_page", json!(config.model.tokens_per_page)),
        ("context_parallel", json!(config.model.context_parallel)),
        ("preset", json!(config.preset_label())),
        ("seed", json!(config.seed)),
        ("store_started_warm", json!(warm)),
        ("stores", stores_json(stores)),
    ]
}
