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
    if let Err(error) = append_line(std::path::Path::new(&path), line) {
        eprintln!("cannot append to {GPU_TEST_LOG_ENV}={path}: {error}");
    }
}

/// Appends `line` and its newline to `path` in one write: tests log from parallel threads, and a line written
/// in pieces could be interleaved with another's (a skipped test would then go uncounted).
fn append_line(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    /// Lines logged from many threads at once each arrive whole: the count of skipped GPU tests that
    /// `cargo xtask ci` prints read 7 in one run and 8 in the next when a line was written in two pieces.
    #[test]
    fn lines_logged_from_parallel_threads_arrive_whole() {
        let dir = std::env::temp_dir().join(format!("kvgate-gpu-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let _ = std::fs::remove_file(&path);
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let path = &path;
                scope.spawn(move || {
                    for n in 0..200 {
                        let line = format!("skipped t{thread}_{n}: no driver here");
                        super::append_line(path, &line).unwrap();
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8 * 200);
        assert!(
            lines
                .iter()
                .all(|line| line.starts_with("skipped t") && line.ends_with(": no driver here"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
