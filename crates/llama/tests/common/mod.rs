//! Helpers shared by the tests: finding the cached model, and writing small GGUF files.
#![allow(
    clippy::disallowed_methods,
    clippy::print_stderr,
    dead_code,
    unreachable_pub,
    reason = "tests read KVGATE_MODEL_DIR and KVGATE_REQUIRE_MODEL and say when they skip; each test binary \
              uses part of this module"
)]

pub mod writer;

use std::path::PathBuf;
use std::sync::OnceLock;

use llama::{Llama, MODEL_DIR_ENV, MODEL_FILE, REQUIRE_MODEL_ENV, Tokenizer};

/// The cached model file, or `None` after saying that `test` skipped; panics when the model is missing and
/// `KVGATE_REQUIRE_MODEL=1`.
pub fn model_path(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(MODEL_DIR_ENV);
    let home = std::env::var_os("HOME");
    if let Some(path) = llama::cached_model(dir.as_deref(), home.as_deref()) {
        return Some(path);
    }
    let where_ = llama::model_dir(dir.as_deref(), home.as_deref())
        .map(|d| d.join(MODEL_FILE).display().to_string())
        .unwrap_or_else(|| format!("(no {MODEL_DIR_ENV} and no HOME)"));
    if std::env::var(REQUIRE_MODEL_ENV).as_deref() == Ok("1") {
        panic!("{REQUIRE_MODEL_ENV}=1 but the model is not at {where_}: run `cargo xtask model`");
    }
    eprintln!("{test}: skipped: no model at {where_} (run `cargo xtask model`)");
    None
}

/// The model and its tokenizer, loaded once per test binary.
pub fn model(test: &str) -> Option<&'static (Llama, Tokenizer)> {
    static MODEL: OnceLock<Option<(Llama, Tokenizer)>> = OnceLock::new();
    let path = model_path(test)?;
    MODEL
        .get_or_init(|| {
            let model = Llama::load(&path).expect("the cached model loads");
            let tokenizer = Tokenizer::from_gguf(model.gguf()).expect("its tokenizer builds");
            Some((model, tokenizer))
        })
        .as_ref()
}
