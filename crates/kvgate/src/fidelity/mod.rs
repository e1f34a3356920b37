//! Simulator fidelity: predict measured vLLM servers and say how far off the simulator is (issue 31).
//!
//! - [`experiment`] reads a measured experiment (vLLM's arguments, inference-perf's workload and its
//!   per-stage results, the model's config and the GPU's datasheet);
//! - [`workload`] regenerates the workload (inference-perf's `shared_prefix` generator, constant-rate
//!   stages);
//! - [`server`] turns vLLM's knobs into the engine's parameters and derives the KV pool as vLLM does;
//! - [`step_model`] is the calibrated step-time model and its coefficient file (`--cost-model FILE`);
//! - [`simulate`] runs one experiment and predicts its figures;
//! - [`calibrate`] fits the coefficients (on all experiments, leaving each profile out, leaving each model
//!   out);
//! - [`target`] prices a cost preset's model with a fit (`agents` and `replay --cost-model FILE`);
//! - [`report`] compares predictions with measurements (`kvgate fidelity DIR`);
//! - [`cli`] holds the two subcommands' options and entry points.
//!
//! The measurements are never copied into the repository: everything reads them from the folder a user
//! names (`../shared/fidelity` in CI).

pub mod calibrate;
#[cfg(feature = "cli")]
pub mod cli;
pub mod experiment;
pub mod report;
pub mod server;
pub mod simulate;
pub(crate) mod step_model;
pub mod target;
pub mod workload;
mod yaml;

#[cfg(test)]
mod tests;

pub use step_model::{Coefficients, CostModelFile};

/// Result of the fidelity tools.
pub type Result<T, E = FidelityError> = std::result::Result<T, E>;

/// What can go wrong reading measurements or coefficients, or simulating them.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A measurement file is malformed or holds something the simulator does not reproduce.
    #[error("{path}: {message}")]
    Invalid {
        /// The file (or the part of the input).
        path: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A coefficient file is malformed or holds an impossible value.
    #[error("cost model {path}: {field}{sep}{message}", sep = if field.is_empty() { "" } else { " " })]
    CostModel {
        /// The file.
        path: String,
        /// The field, as `fits.NAME.FIELD`, when one is to blame.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The engine refused something.
    #[error("engine: {0}")]
    Engine(#[from] engine::Error),
}

impl From<FidelityError> for crate::Error {
    fn from(error: FidelityError) -> crate::Error {
        match error {
            FidelityError::Read { path, source } => crate::Error::ReadFile { path, source },
            FidelityError::Engine(error) => crate::Error::Engine(error),
            other => crate::Error::ConfigSyntax {
                path: "fidelity".to_owned(),
                message: other.to_string(),
            },
        }
    }
}
