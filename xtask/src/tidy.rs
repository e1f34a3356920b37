//! The tidy check: every Rust module starts with a `//!` doc saying what it owns, no test is ignored or
//! expected to panic (assert the error value instead), integration tests build engines from parameters
//! that verify every restore (L5, in release builds too), and `docs/contract.md` stays true to the contract
//! and the tests (see `contract`), and no library function runs over 80 lines (see `fn_length`).

mod contract;
mod fn_length;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

/// Test attributes that are not allowed: a test that cannot fail, or passes by panicking. Spelled in two
/// pieces so that this file does not match its own check.
const FORBIDDEN_ATTRIBUTES: [&str; 2] = [concat!("#", "[ignore"), concat!("#", "[should_panic")];

/// Defaults an integration test may not build an engine from, since they verify restores only in debug
/// builds (L5): each test binary's `main.rs` holds a helper with verification on. Split like
/// `FORBIDDEN_ATTRIBUTES`.
const UNVERIFIED_DEFAULTS: [&str; 2] = [
    concat!("..EngineParams", "::default()"),
    concat!("EngineConfig", "::default()"),
];

/// Whether `shown` (a path from the root) is an integration test file other than its binary's `main.rs`.
fn is_integration_test(shown: &str) -> bool {
    let in_tests = shown.starts_with("tests/") || shown.contains("/tests/it/");
    in_tests && !shown.ends_with("main.rs")
}

pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut problems = Vec::new();
    for dir in ["crates", "xtask", "tests"] {
        for file in rust_files(&root.join(dir)) {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let shown = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            problems.extend(fn_length::check_file(&shown, &text));
            let first_code = text.lines().map(str::trim).find(|l| !l.is_empty());
            if !first_code.is_some_and(|l| l.starts_with("//!")) {
                problems.push(format!("{shown}: module has no `//!` doc at its top"));
            }
            for (line_idx, line) in text.lines().enumerate() {
                let line = line.trim_start();
                if FORBIDDEN_ATTRIBUTES
                    .iter()
                    .any(|attribute| line.starts_with(attribute))
                {
                    problems.push(format!(
                        "{shown}:{}: `{line}` is not allowed; assert the error value",
                        line_idx + 1
                    ));
                }
                if is_integration_test(&shown)
                    && let Some(default) = UNVERIFIED_DEFAULTS.iter().find(|d| line.contains(**d))
                {
                    problems.push(format!(
                        "{shown}:{}: `{default}` verifies restores only in debug builds; start from the \
                         helper in the test binary's main.rs, which turns verification on (L5)",
                        line_idx + 1
                    ));
                }
            }
        }
    }
    problems.extend(contract::check(root)?);
    if problems.is_empty() {
        eprintln!("xtask: tidy ok");
        Ok(())
    } else {
        Err(format!("tidy check failed:\n  {}", problems.join("\n  ")))
    }
}

/// Every `.rs` file under `dir`, skipping build output, in a stable order.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n != "target" && n != "snapshots")
                {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}
