//! The facade's one error type: configuration, input files and engine errors, each naming what is wrong.

/// Result of facade operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the facade.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The model file cannot be loaded (`--executor model`): missing, damaged, or not the model.
    #[error(
        "model {path}: {source}; `cargo xtask model` fetches it, `--model PATH` names another copy"
    )]
    Model {
        /// The model file.
        path: std::path::PathBuf,
        /// Why.
        source: llama::LlamaError,
    },
    /// A chart could not be written.
    #[error("cannot write chart {path}: {reason}; check that the directory is writable")]
    Plot {
        /// The chart file (or its directory).
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The liveness watchdog stopped a run (K3); its report was written, marked incomplete.
    #[error(
        "{policies}: stopped by the liveness watchdog before every request ended; the report above counts \
         what happened until then (scheduler.stall_timeout_s sets the watchdog)"
    )]
    Incomplete {
        /// The policies whose runs stopped, comma-separated.
        policies: String,
    },
    /// An observer stopped the run before every request ended (`Observer::stop`: Ctrl-C in Python).
    #[error("the run was interrupted before every request ended")]
    Interrupted,
    /// The metrics endpoint cannot listen.
    #[error("cannot serve metrics on {addr}: {reason}; give a free address such as 127.0.0.1:9464")]
    Metrics {
        /// The address asked for.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The model file the server's tokenizer reads cannot be used.
    #[error("model {0}; fetch it with `cargo xtask model` or name another with --model")]
    ModelFile(String),
    /// The server cannot start or stopped on an error.
    #[error("serve: {0}")]
    Serve(String),
    /// An HTTP client run against a server failed.
    #[error("client: {0}")]
    Client(String),
    /// A config file is not valid TOML for `EngineConfig`.
    #[error("{path}: {message}")]
    ConfigSyntax {
        /// The file.
        path: String,
        /// The parser's message (it names the line and the field).
        message: String,
    },
    /// A config value is out of its allowed range.
    #[error("config: `{field}` = {value} is out of range; allowed: {allowed}")]
    InvalidConfig {
        /// The field, as `section.name`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// A command-line argument is out of range.
    #[error("{name} {value} is invalid; allowed: {allowed}")]
    InvalidArgument {
        /// The option.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// An environment variable holds a bad value.
    #[error("environment: {name}={value:?} is invalid; allowed: {allowed}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A scenario file is malformed or refers to something that does not exist.
    #[error("scenario {path}: {message}")]
    Scenario {
        /// The file.
        path: String,
        /// What is wrong (serde names the line and column of a syntax error).
        message: String,
    },
    /// The agents workload is misconfigured.
    #[error(transparent)]
    Agents(#[from] crate::workload::agents::AgentsSpecError),
    /// A trace cannot be read.
    #[error(transparent)]
    Trace(#[from] crate::workload::mooncake::TraceError),
    /// The engine refused something.
    /// A check of the facade's own results failed (a bug in kvgate).
    #[error("internal error (a bug in kvgate, please report it): {0}")]
    Internal(String),
    #[error("engine: {0}")]
    Engine(#[from] engine::Error),
}
