//! `EngineConfig`: everything that shapes an engine, loadable from TOML. Every field has a documented default
//! and unit; `validate` names the field and its allowed range; unknown fields are rejected.

use std::path::Path;

use engine::{CopyEngineKind, CostModel, EngineParams, Policy, Preemption};
use kv_pool::{CacheGroup, Geometry, GroupKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::{self, duration_s};

mod group;
mod presets;

pub use group::GroupConfig;

pub use presets::MODEL_PRESETS;

pub(crate) use presets::model_preset;

/// What `model.preset` may name: a cost preset or a model preset.
const PRESETS_ALLOWED: &str = "one of small-8b-gpu, glm-like-moe (cost presets), glm-mla-hybrid, linear-hybrid, sliding-window (model presets)";

/// The fields a model preset sets, as (section, key): a text naming a model preset leaves them out.
const MODEL_PRESET_FIELDS: [(&str, &str); 5] = [
    ("model", "groups"),
    ("model", "tokens_per_page"),
    ("model", "context_parallel"),
    ("scheduler", "draft_tokens"),
    ("scheduler", "draft_acceptance"),
];

/// The environment variable that overrides `restore.max_wait_s` (contract W1).
pub(crate) const RESTORE_MAX_WAIT_ENV: &str = "KVGATE_RESTORE_MAX_WAIT_S";

/// The whole engine configuration. `EngineConfig::default()` is the embedded default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The model: cost preset and cache geometry.
    pub model: ModelConfig,
    /// The KV-cache page pool.
    pub pool: PoolConfig,
    /// The step scheduler.
    pub scheduler: SchedulerConfig,
    /// Restores: bounded wait and the store-side coordinator.
    pub restore: RestoreConfig,
    /// The external checkpoint store.
    pub store: StoreConfig,
    /// Seed of everything random in a run. Default 0.
    pub seed: u64,
    /// Step times replacing the cost preset's (`--cost-model FILE`: the calibrated model of
    /// [`crate::fidelity::target`]); not a config-file field.
    #[serde(skip)]
    pub calibrated_cost: Option<CostModel>,
}

/// The model being served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Step-time cost preset (`small-8b-gpu`, the default, or `glm-like-moe`), or a model preset
    /// (`glm-mla-hybrid`, `linear-hybrid`, `sliding-window`: the cost preset, `tokens_per_page`, `context_parallel`, `groups`,
    /// `scheduler.draft_tokens` and `scheduler.draft_acceptance` together; a file naming one may not set those).
    pub preset: String,
    /// Tokens per page (and per prefix-cache block). Default 16; 1..=4096.
    pub tokens_per_page: u32,
    /// Longest context in tokens. Default 131072.
    pub max_model_len: u32,
    /// Ranks the context is sharded over (decode context parallelism). Default 1; 1..=64.
    pub context_parallel: u32,
    /// Cache groups in order. Default: one full-attention group.
    pub groups: Vec<GroupConfig>,
}

/// The page pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Usable pages per rank (the null page not counted). Default 4095; 1..=4194303. An agents run from the
    /// command line uses its own pool (`run::agents_pool_pages`) unless the file sets this (`ConfigFile::sets`).
    pub pages: u32,
    /// Bytes each page really holds and copies: with the simulated executor a fingerprint (the cost model uses
    /// the model's real bytes); a real model sets its own. Default 32; 8..=1048576, and the pool's pages times
    /// this at most 1 GiB (the `oracle` policy's pool counts when it runs). Read under its old name
    /// `sim_bytes_per_page` too.
    #[serde(alias = "sim_bytes_per_page")]
    pub page_bytes: u32,
    /// Where page bytes live: `host` (aligned host memory, the default) or `cuda` (device memory of GPU
    /// `cuda_device`; needs an NVIDIA driver: without one, building the engine fails naming `storage`).
    pub storage: String,
    /// The GPU of `storage = "cuda"`. Default 0; 0..=63.
    pub cuda_device: u32,
}

/// The step scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Running slots. Default 64; at least 1.
    pub max_running: u32,
    /// Token budget of one step. Default 2048; at least 1.
    pub max_batched_tokens: u32,
    /// Largest prefill chunk of one request in one step, in tokens. Default 512; at least 1.
    pub chunk_tokens: u32,
    /// Draft lookahead tokens per decode step; 0 disables draft decoding. Default 0; at most 16.
    pub draft_tokens: u32,
    /// Probability that a draft token is accepted given that the one before it was: a decode step yields 1 to
    /// `1 + draft_tokens` tokens, `(1 - a^(k+1)) / (1 - a)` on average (`engine::EngineParams::draft_acceptance`).
    /// Default 0 (every draft rejected: one token a step); 0 to 1.
    pub draft_acceptance: f64,
    /// Admission watermark in pages, applied while other work is scheduled. Default 0.
    pub watermark_pages: u32,
    /// The liveness watchdog: a run in which no request produces a token or ends for this many seconds of
    /// engine time stops with an error naming the stuck requests. Default 3600; more than 0.
    pub stall_timeout_s: f64,
    /// What a running request preempted for pages leaves behind: `offload` (its computed KV is captured to
    /// the store when copying it out and back costs less than recomputing it) or `recompute`. Default
    /// `offload`.
    pub preemption: String,
}

/// Restores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestoreConfig {
    /// Longest capacity wait of a restore before it recomputes, in seconds; 0 = recompute at once. Default 60;
    /// at most 1e9. Overridden by the environment variable `KVGATE_RESTORE_MAX_WAIT_S`.
    pub max_wait_s: f64,
    /// Time a store lookup may stay unanswered, in seconds. Default 60; above 0, at most 1e9.
    pub lookup_timeout_s: f64,
    /// Latency of a store lookup on the engine clock, in seconds. Default 0.0002 (a store across a 1 Gbit/s
    /// network, `engine::LOOKUP_LATENCY_DEFAULT`); at most 1e9.
    pub lookup_latency_s: f64,
    /// Copy tasks in flight at most. Default 32; at least 1.
    pub copy_task_limit: u32,
    /// The copy engine: `inline` (modeled time, deterministic; the default), `threaded` (worker threads doing
    /// real memcpy while steps go on; on the simulated clock a copy lasts as many steps as it takes in real
    /// time, so figures depend on the machine), `reordering` (threaded copies whose starts and completions a
    /// seeded adversary delays and reorders, checking that nobody else writes a page a copy owns: L2) or
    /// `cuda` (CUDA streams into the pool's device pages; needs `pool.storage = "cuda"`).
    pub copy_engine: String,
    /// Worker threads of the `threaded` and `reordering` copy engines. Default 2; 1..=64.
    pub copy_workers: u32,
    /// Seed of the `reordering` copy engine's delays and order. Default 0.
    pub copy_seed: u64,
    /// Check every restored page byte for byte against what recompute writes, stopping the run with the
    /// request, page and byte on a mismatch (E3, L5). Default false; debug builds always check.
    pub verify: bool,
    /// Whether a prompt computed in several chunks publishes a checkpoint where its last chunk starts (the
    /// prefill-tail slot, H7). Default false.
    pub capture_prefill_tail: bool,
    /// Pool pages of their own (partial last pages, state) the local snapshots of a hybrid model may keep
    /// cached for later turns' local hits (H9, H10); their blocks are cached blocks like any other. 0 turns
    /// them off; full attention ignores it. Default 512; at most 4 Mi.
    pub state_snapshot_pages: u32,
}

/// The external checkpoint store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Capacity in pages (a checkpoint costs one page per full block it holds). Default 1048576; at least 1.
    pub capacity_pages: u64,
    /// Directory of a disk store whose checkpoints survive a restart; absent (the default) for the
    /// host-memory store. One engine owns it at a time (a lock file names the holder); when several
    /// policies run at once (the command line without `--policy`), each keeps its checkpoints in
    /// `<dir>/<policy>` (`EngineConfig::for_one_of_several`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<std::path::PathBuf>,
    /// URL of a Redis store shared by every engine using it (`redis://HOST:PORT/DB`); absent (the default)
    /// for no Redis store. Not together with `dir`. Every server call times out after
    /// `restore.lookup_timeout_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Prefix of every key the Redis store writes. Default `kvgate:`; at most 256 bytes, no control
    /// characters. When several policies run at once, each uses `<key_prefix><policy>:`.
    pub key_prefix: String,
}

// Every default below is read from `EngineParams::default()`, the one place a default is written; the
// config's pool counts the pages requests can use, the engine's `n_pages` the null page too.

impl Default for ModelConfig {
    fn default() -> Self {
        let params = EngineParams::default();
        ModelConfig {
            preset: params.cost.name.to_string(),
            tokens_per_page: params.geometry.tokens_per_page(),
            max_model_len: params.geometry.max_model_len(),
            context_parallel: params.geometry.context_parallel(),
            groups: vec![GroupConfig::new(GroupKind::Full)],
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        let params = EngineParams::default();
        PoolConfig {
            pages: params.n_pages - 1,
            page_bytes: params.page_bytes,
            storage: "host".to_string(),
            cuda_device: 0,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        let params = EngineParams::default();
        SchedulerConfig {
            max_running: params.max_running,
            max_batched_tokens: params.max_batched_tokens,
            chunk_tokens: params.chunk_tokens,
            draft_tokens: params.draft_tokens,
            draft_acceptance: params.draft_acceptance,
            watermark_pages: params.watermark_pages,
            stall_timeout_s: params.stall_timeout.as_secs_f64(),
            preemption: params.preemption.name().to_string(),
        }
    }
}

impl Default for RestoreConfig {
    fn default() -> Self {
        let params = EngineParams::default();
        RestoreConfig {
            max_wait_s: params.restore_max_wait.as_secs_f64(),
            lookup_timeout_s: params.lookup_timeout.as_secs_f64(),
            lookup_latency_s: params.lookup_latency.as_secs_f64(),
            copy_task_limit: params.copy_task_limit,
            copy_engine: "inline".to_string(),
            copy_workers: 2,
            copy_seed: 0,
            verify: false,
            capture_prefill_tail: params.capture_prefill_tail,
            state_snapshot_pages: params.state_snapshot_pages,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        let params = EngineParams::default();
        StoreConfig {
            capacity_pages: params.store_capacity_pages,
            dir: None,
            url: None,
            key_prefix: checkpoint_transfer::DEFAULT_KEY_PREFIX.to_string(),
        }
    }
}

impl EngineConfig {
    /// Reads, parses and validates a TOML file; the environment override of the restore wait applies.
    pub fn load(path: &Path) -> Result<EngineConfig> {
        Ok(Self::load_file(path)?.config)
    }

    /// `load`, remembering which fields the file set (`ConfigFile::sets`): a driver whose own default
    /// differs from a field's (the agents run's pool) uses it only where the file is silent.
    pub(crate) fn load_file(path: &Path) -> Result<ConfigFile> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            path: shown.clone(),
            source,
        })?;
        let (config, table) = Self::parse(&text).map_err(|error| match error {
            Error::ConfigSyntax { message, .. } => Error::ConfigSyntax {
                path: shown,
                message,
            },
            other => other,
        })?;
        Ok(ConfigFile {
            config: config.with_env_overrides()?,
            table,
        })
    }

    /// Parses and validates TOML text (no environment override).
    pub fn from_toml(text: &str) -> Result<EngineConfig> {
        Ok(Self::parse(text)?.0)
    }

    /// Parses and validates TOML text, returning the config and the table as written.
    fn parse(text: &str) -> Result<(EngineConfig, toml::Table)> {
        let syntax = |e: toml::de::Error| Error::ConfigSyntax {
            path: "<config>".to_string(),
            message: e.to_string(),
        };
        let table: toml::Table = toml::from_str(text).map_err(syntax)?;
        let config: EngineConfig = toml::from_str(text).map_err(syntax)?;
        let config = config.with_model_preset(&|section, key| table_sets(&table, section, key))?;
        config.validate()?;
        Ok((config, table))
    }

    /// This config as TOML text that `from_toml` reads back to an equal config. Under a model preset the
    /// fields the preset sets (`MODEL_PRESET_FIELDS`) are left out, as a file naming one must; a config
    /// whose fields no longer match its model preset cannot be written so and is refused, naming
    /// `model.preset`.
    pub fn to_toml(&self) -> Result<String> {
        let unserializable =
            |e: toml::ser::Error| Error::Internal(format!("a config that TOML cannot hold: {e}"));
        let mut table = toml::Table::try_from(self).map_err(unserializable)?;
        if let Some(preset) = model_preset(&self.model.preset) {
            let mut applied = self.clone();
            applied.apply_preset(preset.name)?;
            if applied != *self {
                return Err(Error::InvalidConfig {
                    field: "model.preset",
                    value: preset.name.to_string(),
                    allowed: "a config whose groups, tokens_per_page, context_parallel, draft_tokens and \
                              draft_acceptance are the model preset's; name its cost preset to write other values"
                        .to_string(),
                });
            }
            for (section, key) in MODEL_PRESET_FIELDS {
                if let Some(section) = table.get_mut(section).and_then(toml::Value::as_table_mut) {
                    section.remove(key);
                }
            }
        }
        toml::to_string(&table).map_err(unserializable)
    }

    /// This config as parsed, with the model preset it names applied (`apply_preset`). `set(section, key)`
    /// says whether the parsed text set a field: a model preset sets the geometry and the drafts, so a
    /// text naming one and setting them too is ambiguous and refused, naming the field. A cost preset
    /// changes nothing.
    pub(crate) fn with_model_preset(
        mut self,
        set: &dyn Fn(&str, &str) -> bool,
    ) -> Result<EngineConfig> {
        let Some(preset) = model_preset(&self.model.preset) else {
            return Ok(self);
        };
        for (section, key) in MODEL_PRESET_FIELDS {
            if set(section, key) {
                return Err(Error::InvalidConfig {
                    field: "model.preset",
                    value: preset.name.to_string(),
                    allowed: format!(
                        "a model preset sets {section}.{key}; remove one of the two (or name a cost preset)"
                    ),
                });
            }
        }
        self.apply_preset(preset.name)?;
        Ok(self)
    }

    /// Applies preset `name`: a cost preset sets `model.preset` alone; a model preset also sets the
    /// geometry (`tokens_per_page`, `context_parallel`, `groups`), `scheduler.draft_tokens` and
    /// `scheduler.draft_acceptance`.
    pub fn apply_preset(&mut self, name: &str) -> Result<()> {
        if let Some(preset) = model_preset(name) {
            self.model.preset = preset.name.to_string();
            self.model.tokens_per_page = preset.tokens_per_page;
            self.model.context_parallel = preset.context_parallel;
            self.model.groups = preset.groups;
            self.scheduler.draft_tokens = preset.draft_tokens;
            self.scheduler.draft_acceptance = preset.draft_acceptance;
            return Ok(());
        }
        if CostModel::preset(name).is_none() {
            return invalid("model.preset", name, PRESETS_ALLOWED);
        }
        name.clone_into(&mut self.model.preset);
        Ok(())
    }

    /// The cost preset `model.preset` names (itself, or the cost preset of a model preset).
    pub(crate) fn cost_preset(&self) -> &str {
        model_preset(&self.model.preset).map_or(self.model.preset.as_str(), |preset| preset.cost)
    }

    /// This config with `restore.max_wait_s` taken from `KVGATE_RESTORE_MAX_WAIT_S` when that is set. The
    /// facade is the only place that reads the environment.
    #[allow(
        clippy::disallowed_methods,
        reason = "the facade is the one place that reads the environment"
    )]
    pub fn with_env_overrides(self) -> Result<EngineConfig> {
        match std::env::var_os(RESTORE_MAX_WAIT_ENV) {
            Some(value) => self.with_restore_max_wait_env(&value.to_string_lossy()),
            None => Ok(self),
        }
    }

    /// This config with `restore.max_wait_s` set from `value`, the text of `KVGATE_RESTORE_MAX_WAIT_S`: a number
    /// of seconds from 0 to 1e9 (surrounding spaces allowed).
    pub(crate) fn with_restore_max_wait_env(mut self, value: &str) -> Result<EngineConfig> {
        let bad = |allowed| Error::Env {
            name: RESTORE_MAX_WAIT_ENV,
            value: value.to_string(),
            allowed,
        };
        let seconds = value
            .trim()
            .parse::<f64>()
            .map_err(|_| bad(limits::SECONDS_ALLOWED))?;
        duration_s(seconds, false).map_err(bad)?;
        self.restore.max_wait_s = seconds;
        Ok(self)
    }

    /// Checks every field against its allowed range; the error names the first field out of range.
    pub fn validate(&self) -> Result<()> {
        if CostModel::preset(self.cost_preset()).is_none() {
            return invalid("model.preset", &self.model.preset, PRESETS_ALLOWED);
        }
        check_range("model.tokens_per_page", self.model.tokens_per_page, 1, 4096)?;
        self.preemption()?;
        check_range(
            "model.max_model_len",
            self.model.max_model_len,
            1,
            limits::MODEL_LEN_MAX,
        )?;
        check_range("model.context_parallel", self.model.context_parallel, 1, 64)?;
        if self.model.groups.is_empty() {
            return invalid("model.groups", "[]", "at least one cache group");
        }
        self.check_sizes()?;
        check_seconds(
            "scheduler.stall_timeout_s",
            self.scheduler.stall_timeout_s,
            true,
        )?;
        check_seconds("restore.max_wait_s", self.restore.max_wait_s, false)?;
        check_seconds(
            "restore.lookup_timeout_s",
            self.restore.lookup_timeout_s,
            true,
        )?;
        check_seconds(
            "restore.lookup_latency_s",
            self.restore.lookup_latency_s,
            false,
        )?;
        check_range(
            "restore.copy_task_limit",
            self.restore.copy_task_limit,
            1,
            1 << 16,
        )?;
        if self.store.capacity_pages == 0 {
            return invalid("store.capacity_pages", "0", "at least 1");
        }
        if self
            .store
            .dir
            .as_ref()
            .is_some_and(|dir| dir.as_os_str().is_empty())
        {
            return invalid(
                "store.dir",
                "\"\"",
                "a directory path; leave the field out for the host-memory store",
            );
        }
        self.check_store_url()?;
        self.check_storage_kind()?;
        check_storage(&self.params(Policy::Reserved)?)
    }

    /// The pool's and scheduler's sizes are in range.
    fn check_sizes(&self) -> Result<()> {
        check_range(
            "pool.pages",
            self.pool.pages,
            1,
            EngineParams::N_PAGES_MAX - 1,
        )?;
        check_range(
            "pool.page_bytes",
            self.pool.page_bytes,
            8,
            EngineParams::PAGE_BYTES_MAX,
        )?;
        check_range(
            "scheduler.max_running",
            self.scheduler.max_running,
            1,
            1 << 20,
        )?;
        check_range(
            "scheduler.max_batched_tokens",
            self.scheduler.max_batched_tokens,
            1,
            1 << 24,
        )?;
        check_range(
            "scheduler.chunk_tokens",
            self.scheduler.chunk_tokens,
            1,
            1 << 24,
        )?;
        check_range("scheduler.draft_tokens", self.scheduler.draft_tokens, 0, 16)?;
        let acceptance = self.scheduler.draft_acceptance;
        if !(0.0..=1.0).contains(&acceptance) {
            return invalid(
                "scheduler.draft_acceptance",
                &limits::show(acceptance),
                "a probability from 0 to 1",
            );
        }
        Ok(())
    }

    /// `store.url` parses as a Redis URL and is not given together with `store.dir`; `store.key_prefix` fits.
    fn check_store_url(&self) -> Result<()> {
        let prefix = &self.store.key_prefix;
        if prefix.len() > checkpoint_transfer::KEY_PREFIX_BYTES_MAX
            || prefix.chars().any(char::is_control)
        {
            return invalid(
                "store.key_prefix",
                &format!("{prefix:?}"),
                "at most 256 bytes without control characters",
            );
        }
        let Some(url) = &self.store.url else {
            return Ok(());
        };
        if self.store.dir.is_some() {
            return invalid(
                "store.url",
                &format!("{url:?}"),
                "a Redis store or a disk store (store.dir), not both; leave one out",
            );
        }
        checkpoint_transfer::check_redis_url(url).or_else(|reason| {
            invalid(
                "store.url",
                &format!("{url:?}"),
                &format!("redis://HOST:PORT/DB ({reason})"),
            )
        })
    }

    /// The cache geometry this config describes.
    pub fn geometry(&self) -> Result<Geometry> {
        let cost = self.cost()?;
        let default_bytes = cost.kv_bytes_per_token * u64::from(self.model.tokens_per_page);
        let groups = self
            .model
            .groups
            .iter()
            .map(|group| CacheGroup {
                kind: group.kind,
                bytes_per_page: group.bytes_per_page.unwrap_or(default_bytes),
            })
            .collect();
        Geometry::new(
            groups,
            self.model.tokens_per_page,
            self.model.context_parallel,
            self.model.max_model_len,
        )
        .map_err(|e| Error::InvalidConfig {
            field: "model.groups",
            value: format!("{} group(s)", self.model.groups.len()),
            allowed: e.to_string(),
        })
    }

    /// The cost model of `model.preset`, or the calibrated one that replaces it.
    pub fn cost(&self) -> Result<CostModel> {
        if let Some(cost) = &self.calibrated_cost {
            return Ok(cost.clone());
        }
        CostModel::preset(self.cost_preset()).ok_or_else(|| Error::InvalidConfig {
            field: "model.preset",
            value: self.model.preset.clone(),
            allowed: PRESETS_ALLOWED.to_string(),
        })
    }

    /// What a report calls the model: `model.preset`, and where the step times come from when a calibrated
    /// cost model replaces the preset's.
    pub fn preset_label(&self) -> String {
        match &self.calibrated_cost {
            Some(_) => format!(
                "{} (steps: --cost-model, calibrated for Llama-3-8B on one H100 SXM)",
                self.model.preset
            ),
            None => self.model.preset.clone(),
        }
    }

    /// This config for the engine of `policy` when several engines run at once: its disk store, if any, in
    /// the subdirectory `<store.dir>/<policy>`, so no two engines share a directory, and its Redis keys under
    /// `<store.key_prefix><policy>:`, so no engine restores another policy's checkpoints.
    pub(crate) fn for_one_of_several(&self, policy: Policy) -> EngineConfig {
        let mut config = self.clone();
        if let Some(dir) = &mut config.store.dir {
            dir.push(policy.name());
        }
        if config.store.url.is_some() {
            config.store.key_prefix = format!("{}{}:", config.store.key_prefix, policy.name());
        }
        config
    }

    /// The copy engine `[restore] copy_engine` and `copy_workers` name.
    fn copy_engine_kind(&self) -> Result<CopyEngineKind> {
        check_range("restore.copy_workers", self.restore.copy_workers, 1, 64)?;
        match self.restore.copy_engine.as_str() {
            "inline" => Ok(CopyEngineKind::Inline),
            "threaded" => Ok(CopyEngineKind::Threaded {
                workers: self.restore.copy_workers,
            }),
            "reordering" => Ok(CopyEngineKind::Reordering {
                workers: self.restore.copy_workers,
                seed: self.restore.copy_seed,
            }),
            "cuda" => {
                if self.pool.storage != "cuda" {
                    invalid(
                        "restore.copy_engine",
                        "cuda",
                        &format!(
                            "cuda copies write into CUDA page storage, and pool.storage is {:?}: set \
                             pool.storage = \"cuda\" (--storage cuda), or use inline, threaded or reordering",
                            self.pool.storage
                        ),
                    )?;
                }
                // The facade gives the CUDA copy engine with the CUDA storage (`builder::engine_builder`);
                // the engine's own copy engine is then unused.
                Ok(CopyEngineKind::Inline)
            }
            other => {
                invalid(
                    "restore.copy_engine",
                    other,
                    "inline, threaded, reordering or cuda",
                )?;
                Ok(CopyEngineKind::Inline)
            }
        }
    }

    /// The preemption `[scheduler] preemption` names.
    fn preemption(&self) -> Result<Preemption> {
        self.scheduler.preemption.parse().or_else(|_| {
            invalid(
                "scheduler.preemption",
                &self.scheduler.preemption,
                "offload or recompute",
            )?;
            Ok(Preemption::default())
        })
    }

    /// The GPU whose memory holds the pool's pages (`[pool] storage = "cuda"`, `cuda_device`), or `None` for
    /// host memory. `validate` checked both fields.
    pub(crate) fn cuda_device(&self) -> Option<u32> {
        (self.pool.storage == "cuda").then_some(self.pool.cuda_device)
    }

    /// Whether restores copy through CUDA streams (`[restore] copy_engine = "cuda"`, on CUDA storage).
    pub(crate) fn cuda_copies(&self) -> bool {
        self.restore.copy_engine == "cuda"
    }

    /// `[pool] storage` is `host` or `cuda`, and `cuda_device` a device ordinal.
    fn check_storage_kind(&self) -> Result<()> {
        match self.pool.storage.as_str() {
            "host" => Ok(()),
            "cuda" => check_range(
                "pool.cuda_device",
                self.pool.cuda_device,
                0,
                CUDA_DEVICE_MAX,
            ),
            other => invalid("pool.storage", other, "host or cuda"),
        }
    }

    /// The engine parameters for a run of `policy`. Errors: any field out of range, and page storage above its
    /// limit under `policy` (the `oracle` policy's pool is larger).
    pub fn engine_params(&self, policy: Policy) -> Result<EngineParams> {
        self.validate()?;
        let params = self.params(policy)?;
        check_storage(&params)?;
        Ok(params)
    }

    /// The engine parameters for `policy`, the page storage unchecked.
    fn params(&self, policy: Policy) -> Result<EngineParams> {
        let seconds = |field, value, positive| {
            duration_s(value, positive).map_err(|allowed| Error::InvalidConfig {
                field,
                value: limits::show(value),
                allowed: allowed.to_string(),
            })
        };
        Ok(EngineParams {
            geometry: self.geometry()?,
            n_pages: self.pool.pages + 1,
            max_running: self.scheduler.max_running,
            max_batched_tokens: self.scheduler.max_batched_tokens,
            chunk_tokens: self.scheduler.chunk_tokens,
            draft_tokens: self.scheduler.draft_tokens,
            // The model's own end of turn: `kvgate serve --executor model` sets it from its tokenizer.
            stop_token: None,
            draft_acceptance: self.scheduler.draft_acceptance,
            policy,
            restore_max_wait: seconds("restore.max_wait_s", self.restore.max_wait_s, false)?,
            lookup_timeout: seconds(
                "restore.lookup_timeout_s",
                self.restore.lookup_timeout_s,
                true,
            )?,
            lookup_latency: seconds(
                "restore.lookup_latency_s",
                self.restore.lookup_latency_s,
                false,
            )?,
            copy_task_limit: self.restore.copy_task_limit,
            watermark_pages: self.scheduler.watermark_pages,
            store_capacity_pages: self.store.capacity_pages,
            page_bytes: self.pool.page_bytes,
            cost: self.cost()?,
            verify_restores: self.restore.verify || cfg!(any(debug_assertions, test)),
            copy_engine: self.copy_engine_kind()?,
            capture_prefill_tail: self.restore.capture_prefill_tail,
            state_snapshot_pages: self.restore.state_snapshot_pages,
            clock: engine::ClockKind::Simulated,
            preemption: self.preemption()?,
            seed: self.seed,
            stall_timeout: seconds(
                "scheduler.stall_timeout_s",
                self.scheduler.stall_timeout_s,
                true,
            )?,
        })
    }
}

/// A config file as loaded: the config, and which fields the file set.
#[derive(Clone, Debug)]
pub(crate) struct ConfigFile {
    /// The config (validated, the environment override applied).
    pub config: EngineConfig,
    /// The file's text as a table.
    table: toml::Table,
}

impl ConfigFile {
    /// Whether the file set field `key` of `section` (a field left out takes its default).
    pub(crate) fn sets(&self, section: &str, key: &str) -> bool {
        table_sets(&self.table, section, key)
    }
}

/// Whether `table` holds `key` in its table `section`.
fn table_sets(table: &toml::Table, section: &str, key: &str) -> bool {
    table
        .get(section)
        .and_then(toml::Value::as_table)
        .is_some_and(|section| section.contains_key(key))
}

/// Largest CUDA device ordinal `[pool] cuda_device` may name.
const CUDA_DEVICE_MAX: u32 = 63;

fn invalid(field: &'static str, value: &str, allowed: &str) -> Result<()> {
    Err(Error::InvalidConfig {
        field,
        value: value.to_string(),
        allowed: allowed.to_string(),
    })
}

fn check_range(field: &'static str, value: u32, min: u32, max: u32) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        invalid(field, &value.to_string(), &format!("{min}..={max}"))
    }
}

fn check_seconds(field: &'static str, value: f64, positive: bool) -> Result<()> {
    match duration_s(value, positive) {
        Ok(_) => Ok(()),
        Err(allowed) => invalid(field, &limits::show(value), allowed),
    }
}

/// Refuses a pool whose page storage, once every page is written, would pass its limit.
fn check_storage(params: &EngineParams) -> Result<()> {
    if params.storage_bytes() <= EngineParams::STORAGE_BYTES_MAX {
        return Ok(());
    }
    let pages = params.pool_pages();
    let ranks = params.geometry.context_parallel();
    let (on_ranks, times_ranks) = if ranks > 1 {
        (format!(" on {ranks} ranks"), " times ranks")
    } else {
        (String::new(), "")
    };
    invalid(
        "pool.page_bytes",
        &params.page_bytes.to_string(),
        &format!(
            "at most {} for the {} policy's pool of {pages} pages{on_ranks}: pages{times_ranks} times \
             page_bytes must stay within {} bytes of page storage; lower pool.pages or \
             pool.page_bytes",
            EngineParams::STORAGE_BYTES_MAX / (u64::from(pages) * u64::from(ranks)),
            params.policy.name(),
            EngineParams::STORAGE_BYTES_MAX,
        ),
    )
}

#[cfg(test)]
mod tests;
