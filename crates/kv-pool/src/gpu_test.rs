//! The gate every GPU test passes first, so a test that needs a driver never reports `ok` silently: with a
//! driver it runs; without one it prints `skipped: <test>: <reason>` and returns, or fails when
//! `KVGATE_REQUIRE_GPU=1`. Each outcome is appended as a line (`ran <test>` / `skipped <test>: <reason>`)
//! to the file `KVGATE_GPU_TEST_LOG` names, if set: `cargo xtask ci` and `cargo xtask gpu` count them.
#![allow(
    clippy::disallowed_methods,
    clippy::print_stderr,
    reason = "a GPU test reads KVGATE_REQUIRE_GPU and KVGATE_GPU_TEST_LOG and says on stderr that it skipped"
)]

use std::io::Write;

use crate::storage::cuda_available;

/// Set to `1`, a missing driver fails every GPU test instead of skipping it.
pub const REQUIRE_GPU_ENV: &str = "KVGATE_REQUIRE_GPU";
/// A file each GPU test appends its outcome to, one line each.
pub const GPU_TEST_LOG_ENV: &str = "KVGATE_GPU_TEST_LOG";

/// Whether GPU test `test` runs here: `Ok(true)` with a driver, `Ok(false)` (printed, logged) without one,
/// `Err` without one when `KVGATE_REQUIRE_GPU=1`.
pub fn gpu_test_gate(test: &str) -> Result<bool, String> {
    match cuda_available() {
        Ok(()) => {
            log_outcome(&format!("ran {test}"));
            Ok(true)
        }
        Err(reason) => {
            if std::env::var(REQUIRE_GPU_ENV).as_deref() == Ok("1") {
                log_outcome(&format!("failed {test}: {reason}"));
                return Err(format!(
                    "{REQUIRE_GPU_ENV}=1 but cuda is unavailable: {reason}"
                ));
            }
            eprintln!("skipped: {test}: {reason}");
            log_outcome(&format!("skipped {test}: {reason}"));
            Ok(false)
        }
    }
}

fn log_outcome(line: &str) {
    let Ok(path) = std::env::var(GPU_TEST_LOG_ENV) else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    let written = file.and_then(|mut file| writeln!(file, "{line}"));
    if let Err(error) = written {
        eprintln!("cannot append to {GPU_TEST_LOG_ENV}={path}: {error}");
    }
}
