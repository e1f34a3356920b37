//! The options the Python run functions take, read from the dict the package passes, and the engine config
//! they make: the command line's `load_config`, option for option, so a run from Python and the same run
//! from the command line are the same run.

use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Deserialize;

use kvgate::{EngineConfig, Policy};

use crate::convert::from_py;

/// Where a config comes from: a TOML file (as `--config FILE`) or a dict of the same tables.
#[derive(Clone, Debug)]
pub(crate) enum ConfigSource {
    File(PathBuf),
    Table(serde_json::Value),
}

/// The options every run shares (the command line's `RunArgs`).
#[derive(Clone, Debug, Default)]
pub(crate) struct RunOptions {
    pub(crate) config: Option<ConfigSource>,
    pub(crate) pool_pages: Option<u32>,
    pub(crate) store_pages: Option<u64>,
    pub(crate) preset: Option<String>,
    pub(crate) seed: Option<u64>,
    pub(crate) preemption: Option<String>,
    pub(crate) storage: Option<String>,
    pub(crate) copy_engine: Option<String>,
    pub(crate) policies: Vec<String>,
    pub(crate) verify: bool,
}

/// Field `key` of `options`, `None` when missing or `None`.
pub(crate) fn get<'py, T: for<'a> FromPyObject<'a, 'py, Error = PyErr>>(
    options: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<T>> {
    match options.get_item(key)? {
        Some(value) if !value.is_none() => value
            .extract::<T>()
            .map(Some)
            .map_err(|error| PyTypeError::new_err(format!("{key}: {}", error.value(options.py())))),
        _ => Ok(None),
    }
}

impl RunOptions {
    /// The shared options of `options`.
    pub(crate) fn from_dict(options: &Bound<'_, PyDict>) -> PyResult<RunOptions> {
        let config = match (
            get::<PathBuf>(options, "config_file")?,
            options.get_item("config_table")?,
        ) {
            (Some(path), _) => Some(ConfigSource::File(path)),
            (None, Some(table)) if !table.is_none() => {
                Some(ConfigSource::Table(from_py(&table, "config")?))
            }
            (None, _) => None,
        };
        Ok(RunOptions {
            config,
            pool_pages: get(options, "pool_pages")?,
            store_pages: get(options, "store_pages")?,
            preset: get(options, "preset")?,
            seed: get(options, "seed")?,
            preemption: get(options, "preemption")?,
            storage: get(options, "storage")?,
            copy_engine: get(options, "copy_engine")?,
            policies: get(options, "policies")?.unwrap_or_default(),
            verify: get(options, "verify")?.unwrap_or(false),
        })
    }
}

/// A config dict as TOML text, and whether it sets `[pool] pages`.
pub(crate) fn table_toml(table: &serde_json::Value) -> kvgate::Result<(String, bool)> {
    let syntax = |message: String| kvgate::Error::ConfigSyntax {
        path: "<config dict>".to_owned(),
        message,
    };
    let table = toml::Table::deserialize(table.clone()).map_err(|e| syntax(e.to_string()))?;
    let pool_pages_set = table
        .get("pool")
        .and_then(toml::Value::as_table)
        .is_some_and(|pool| pool.contains_key("pages"));
    Ok((table.to_string(), pool_pages_set))
}

/// The config of a run: the file's or dict's (or the default), the options applied; and whether the options
/// or the config set the pool's pages (the command line's `load_config`).
pub(crate) fn load_config(options: &RunOptions) -> kvgate::Result<(EngineConfig, bool)> {
    let (mut config, mut pool_pages_set) = match &options.config {
        Some(ConfigSource::File(path)) => {
            let file = EngineConfig::load_file(path)?;
            let set = file.sets("pool", "pages");
            (file.config, set)
        }
        Some(ConfigSource::Table(table)) => {
            let (text, set) = table_toml(table)?;
            (EngineConfig::from_toml(&text)?.with_env_overrides()?, set)
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
        config.apply_preset(preset)?;
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

/// The policies named (all four when none is), as the command line's `--policy`.
pub(crate) fn policies(names: &[String]) -> kvgate::Result<Vec<Policy>> {
    if names.is_empty() {
        return Ok(Policy::ALL.to_vec());
    }
    names
        .iter()
        .map(|name| name.parse::<Policy>().map_err(kvgate::Error::from))
        .collect()
}

/// The config of `policy`'s engine when `n_policies` run at once (each its own store directory).
pub(crate) fn config_of(config: &EngineConfig, policy: Policy, n_policies: usize) -> EngineConfig {
    if n_policies > 1 {
        config.for_one_of_several(policy)
    } else {
        config.clone()
    }
}
