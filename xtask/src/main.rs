//! Project automation, run as `cargo xtask <command>`: `ci` (format, lints, tests, layering, tidy), `bench`
//! (every crate's benchmarks merged into one report), `gpu` (CUDA tests and figures), `tidy` and `layers`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "xtask is a command-line tool: it prints, reads the environment and times benchmarks"
)]

mod bench;
mod layers;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci           format check, clippy (warnings denied), every test, layering and tidy checks
  bench        run every crate's benchmarks; `--json` prints one JSON object on stdout
  gpu          CUDA tests and bandwidth figures (needs an NVIDIA driver; says so when absent)
  layers       check that each crate depends only on the layers below it
  tidy         check module docs, forbidden test attributes, and docs/contract.md against the
               contract ids and the tests";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("gpu") => gpu(),
        Some("layers") => layers::check(&root()),
        Some("tidy") => tidy::check(&root()),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn ci() -> Result<(), String> {
    let root = root();
    cargo(&root, &["fmt", "--all", "--check"])?;
    cargo(
        &root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    layers::check(&root)?;
    tidy::check(&root)?;
    cargo(&root, &["test", "--workspace", "--all-targets", "--locked"])?;
    cargo(&root, &["test", "--workspace", "--doc", "--locked"])?;
    eprintln!("xtask: ci passed");
    Ok(())
}

fn gpu() -> Result<(), String> {
    let root = root();
    eprintln!("xtask: CUDA tests (they print that they skipped when no driver is present)");
    cargo_env(
        &root,
        &[
            "test",
            "--workspace",
            "--release",
            "--locked",
            "cuda",
            "--",
            "--nocapture",
        ],
        &[("KVGATE_REQUIRE_GPU", "1")],
    )?;
    bench::run(&["--gpu".to_string()])
}

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the root")
        .to_path_buf()
}

pub(crate) fn cargo(root: &Path, args: &[&str]) -> Result<(), String> {
    cargo_env(root, args, &[])
}

fn cargo_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(cargo_bin())
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

pub(crate) fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// The repository's own checks as ordinary tests, so that a plain `cargo test` catches them too.
#[cfg(test)]
mod checks {
    #[test]
    fn every_crate_depends_only_on_the_layers_below_it() {
        if let Err(problems) = super::layers::check(&super::root()) {
            panic!("{problems}");
        }
    }

    #[test]
    fn the_repository_is_tidy() {
        if let Err(problems) = super::tidy::check(&super::root()) {
            panic!("{problems}");
        }
    }
}
