//! The options the Python run functions take, read from the dict the package passes into the facade's
//! `setup::RunOptions`, which the command line's flags fill too: the same options make the same config
//! (`setup::load_config`) and the same run.

use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Deserialize;

use kvgate::setup::{self, ConfigSource};

use crate::convert::from_py;
use crate::errors;

/// The options every run shares (the command line's `RunArgs`): the facade's, and the policies named.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunOptions {
    pub(crate) run: setup::RunOptions,
    pub(crate) policies: Vec<String>,
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
                let table = from_py(&table, "config")?;
                let table = toml::Table::deserialize(table)
                    .map_err(|error| errors::facade(options.py(), syntax(error.to_string())))?;
                Some(ConfigSource::Table(table))
            }
            (None, _) => None,
        };
        let run = setup::RunOptions {
            config,
            pool_pages: get(options, "pool_pages")?,
            store_pages: get(options, "store_pages")?,
            preset: get(options, "preset")?,
            seed: get(options, "seed")?,
            preemption: get(options, "preemption")?,
            storage: get(options, "storage")?,
            copy_engine: get(options, "copy_engine")?,
            cost_model: get::<String>(options, "cost_model")?.map(std::path::PathBuf::from),
            verify: get(options, "verify")?.unwrap_or(false),
        };
        Ok(RunOptions {
            run,
            policies: get(options, "policies")?.unwrap_or_default(),
        })
    }
}

/// The error of a config dict that is no TOML table.
fn syntax(message: String) -> kvgate::Error {
    kvgate::Error::ConfigSyntax {
        path: "<config dict>".to_owned(),
        message,
    }
}

/// A config dict as TOML text.
pub(crate) fn table_toml(table: &serde_json::Value) -> kvgate::Result<String> {
    let table = toml::Table::deserialize(table.clone()).map_err(|e| syntax(e.to_string()))?;
    Ok(table.to_string())
}
