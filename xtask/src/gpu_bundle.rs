//! `cargo xtask gpu --bundle [DIR]`: `cargo xtask gpu` built here and run elsewhere. The device machine
//! that lends a GPU has no Rust toolchain and no network, so this builds (profile `gpu-bundle`: release
//! code, no debug info) every binary the steps of `GPU_BUDGET` run (the test binaries that hold tests
//! named `cuda`, the `kvgate` binary, the restore bench, and xtask itself for its driver probe), copies
//! them into `DIR/bin` (default `target/gpu-bundle`) and writes `DIR/run.sh`, a bash script generated from
//! `GPU_BUDGET` that runs the same steps in the same order under the same budgets (`timeout`). On the
//! device: `run` with `carry: ["target/gpu-bundle"]` and the command `bash target/gpu-bundle/run.sh`,
//! from the repository root of the copy of the working tree.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{GPU_BUDGET, LIVE_AGENTS_REFERENCE, LIVE_AGENTS_SIMULATED, RESTORE_BENCH_ARGS};

/// Where the bundle goes when `--bundle` names no folder (relative to the repository root).
pub(crate) const DEFAULT_DIR: &str = "target/gpu-bundle";

/// The test filter of the `cuda tests` step: what `cargo test ... --tests cuda` passes each binary.
const TEST_FILTER: &str = "cuda";

/// What the bundle build selects: every test binary, the `kvgate` binary, xtask (its driver probe) and
/// the restore bench, in one cargo run so that features unify once.
const BUILD_ARGS: [&str; 15] = [
    "build",
    "--profile",
    "gpu-bundle",
    "--locked",
    "--workspace",
    "--tests",
    "--bin",
    "kvgate",
    "--bin",
    "xtask",
    "--bench",
    "restore",
    "--message-format",
    "json-render-diagnostics",
    "--quiet",
];

/// One test binary of the bundle: its file under `bin/`, its package's folder (cargo runs a test binary
/// from there) and how many of its tests the filter selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BundledTest {
    pub(crate) file: String,
    pub(crate) dir: String,
    pub(crate) n_selected: usize,
}

/// A built artifact as cargo reported it.
#[derive(Debug)]
struct Artifact {
    executable: PathBuf,
    package_dir: String,
    target: String,
    test: bool,
}

/// Builds the bundle into `dir`: the binaries, stripped of debug info by the profile, and `run.sh`.
pub(crate) fn bundle(root: &Path, dir: &Path) -> Result<(), String> {
    let artifacts = build(root)?;
    let bin = dir.join("bin");
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&bin).map_err(|e| format!("cannot make {}: {e}", bin.display()))?;
    let mut tests = Vec::new();
    for artifact in &artifacts {
        let file = if artifact.test {
            let n_selected = count_selected(root, artifact)?;
            if n_selected == 0 {
                continue;
            }
            let package = Path::new(&artifact.package_dir)
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
            let file = format!("{package}-{}", artifact.target);
            tests.push(BundledTest {
                file: file.clone(),
                dir: artifact.package_dir.clone(),
                n_selected,
            });
            file
        } else {
            artifact.target.clone()
        };
        std::fs::copy(&artifact.executable, bin.join(&file))
            .map_err(|e| format!("cannot copy {}: {e}", artifact.executable.display()))?;
    }
    for needed in ["kvgate", "xtask", "restore"] {
        if !bin.join(needed).exists() {
            return Err(format!("the bundle build made no `{needed}` binary"));
        }
    }
    let sizes = compress(&bin)?;
    tests.sort_by(|a, b| a.file.cmp(&b.file));
    let script = run_script(&tests)?;
    let run_sh = dir.join("run.sh");
    std::fs::write(&run_sh, script)
        .map_err(|e| format!("cannot write {}: {e}", run_sh.display()))?;
    report(root, dir, &tests, &sizes)
}

/// Compresses every binary of `bin` (`gzip -9`; `run.sh` unpacks them into a temporary folder), returning
/// each one's name with its size before and after, by name.
fn compress(bin: &Path) -> Result<Vec<(String, u64, u64)>, String> {
    let mut sizes = Vec::new();
    for entry in
        std::fs::read_dir(bin).map_err(|e| format!("cannot read {}: {e}", bin.display()))?
    {
        let path = entry
            .map_err(|e| format!("cannot read {}: {e}", bin.display()))?
            .path();
        let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let before = size(&path);
        let status = Command::new("gzip")
            .args(["-9", "-n"])
            .arg(&path)
            .status()
            .map_err(|e| format!("cannot run gzip: {e}"))?;
        if !status.success() {
            return Err(format!("gzip {} failed ({status})", path.display()));
        }
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let after = size(&bin.join(format!("{name}.gz")));
        sizes.push((name, before, after));
    }
    sizes.sort();
    Ok(sizes)
}

/// Runs the bundle build and returns the binaries it made: the test binaries, `kvgate`, `xtask` and the
/// restore bench.
fn build(root: &Path) -> Result<Vec<Artifact>, String> {
    eprintln!("xtask: cargo {}", BUILD_ARGS.join(" "));
    let output = Command::new(crate::cargo_bin())
        .args(BUILD_ARGS)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("the bundle build failed ({})", output.status));
    }
    let mut artifacts = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let message: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("cargo printed a line that is not JSON ({e}): {line}"))?;
        if let Some(artifact) = artifact_of(root, &message) {
            artifacts.push(artifact);
        }
    }
    Ok(artifacts)
}

/// The artifact a cargo message reports, when it is an executable the bundle may carry.
fn artifact_of(root: &Path, message: &serde_json::Value) -> Option<Artifact> {
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let executable = PathBuf::from(message["executable"].as_str()?);
    let manifest = Path::new(message["manifest_path"].as_str()?);
    let package_dir = manifest
        .parent()?
        .strip_prefix(root)
        .ok()?
        .to_string_lossy()
        .into_owned();
    let target = message["target"]["name"].as_str()?.replace('-', "_");
    let kind = message["target"]["kind"][0].as_str()?.to_string();
    // Cargo builds benches with the test flag too; a bench is never one of the test binaries.
    let test = message["profile"]["test"].as_bool()? && kind != "bench";
    let wanted = test
        || matches!(
            (kind.as_str(), target.as_str()),
            ("bin", "kvgate" | "xtask") | ("bench", "restore")
        );
    wanted.then_some(Artifact {
        executable,
        package_dir,
        target: if test && kind == "lib" {
            "lib".to_string()
        } else {
            target
        },
        test,
    })
}

/// How many tests of a test binary the `cuda tests` step's filter selects (`--list`, from its package's
/// folder as cargo runs it).
fn count_selected(root: &Path, artifact: &Artifact) -> Result<usize, String> {
    let output = Command::new(&artifact.executable)
        .args(["--list", TEST_FILTER])
        .current_dir(root.join(&artifact.package_dir))
        .output()
        .map_err(|e| format!("cannot list {}: {e}", artifact.executable.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} --list failed ({}): {}",
            artifact.executable.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let listed = String::from_utf8_lossy(&output.stdout);
    Ok(listed
        .lines()
        .filter(|line| line.ends_with(": test"))
        .count())
}

/// Prints what went into the bundle and its size, and fails when the bundle and the working tree (what a
/// device call sends: tracked files and untracked ones git does not ignore) are more than it carries.
fn report(
    root: &Path,
    dir: &Path,
    tests: &[BundledTest],
    sizes: &[(String, u64, u64)],
) -> Result<(), String> {
    for (file, before, after) in sizes {
        let selected = tests
            .iter()
            .find(|test| &test.file == file)
            .map(|test| format!(" ({} tests named {TEST_FILTER})", test.n_selected))
            .unwrap_or_default();
        eprintln!(
            "xtask:   bin/{file}: {:.1} MiB, {:.1} MiB compressed{selected}",
            *before as f64 / MIB,
            *after as f64 / MIB
        );
    }
    let unpacked: u64 = sizes.iter().map(|(_, before, _)| before).sum();
    let bundle: u64 = sizes.iter().map(|(_, _, after)| after).sum();
    let tree = working_tree_bytes(root)?;
    eprintln!(
        "xtask: gpu bundle in {}: {} binaries, {:.1} MiB ({:.1} MiB unpacked); with the working tree ({:.1} MiB) \
         a device call carries {:.1} MiB of its {CARRY_LIMIT_MIB} MiB; run it with `bash {}/run.sh` from the \
         repository root",
        dir.display(),
        sizes.len(),
        bundle as f64 / MIB,
        unpacked as f64 / MIB,
        tree as f64 / MIB,
        (bundle + tree) as f64 / MIB,
        dir.strip_prefix(root).unwrap_or(dir).display()
    );
    if (bundle + tree) as f64 > CARRY_LIMIT_MIB * MIB {
        return Err(format!(
            "the bundle and the working tree are {:.1} MiB, over the {CARRY_LIMIT_MIB} MiB a device call carries",
            (bundle + tree) as f64 / MIB
        ));
    }
    Ok(())
}

/// Bytes of the files a device call sends from the working tree: tracked, and untracked but not ignored.
fn working_tree_bytes(root: &Path) -> Result<u64, String> {
    let output = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git ls-files: {e}"))?;
    if !output.status.success() {
        return Err(format!("git ls-files failed ({})", output.status));
    }
    Ok(output
        .stdout
        .split(|&byte| byte == 0)
        .filter(|path| !path.is_empty())
        .filter_map(|path| {
            std::fs::metadata(root.join(String::from_utf8_lossy(path).as_ref())).ok()
        })
        .map(|metadata| metadata.len())
        .sum())
}

const MIB: f64 = 1024.0 * 1024.0;
/// What one device call carries, the working tree included.
const CARRY_LIMIT_MIB: f64 = 64.0;

/// The file name of a step's log: its index and its name in lowercase words joined by `-`.
fn log_name(index: usize, step: &str) -> String {
    let words: Vec<String> = step
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    format!("{}-{}", index + 1, words.join("-"))
}

/// The body of the bash function that runs `step` of `GPU_BUDGET` from the bundle. It returns 0 when the
/// step passed, 3 when it skipped for want of a driver, anything else when it failed.
fn step_body(step: &str, tests: &[BundledTest]) -> Result<String, String> {
    let quoted = |args: &[&str]| args.join(" ");
    match step {
        "build" => {
            let mut body = String::from(
                "    # Built where the bundle was made: here, check that every binary loads and lists its tests.\n    \
                 local failed=0\n    check_loads || failed=1\n",
            );
            for test in tests {
                body.push_str(&format!(
                    "    check_listed {} {} {} || failed=1\n",
                    test.file, test.dir, test.n_selected
                ));
            }
            body.push_str("    return $failed\n");
            Ok(body)
        }
        "cuda tests" => {
            let mut body = String::from("    local failed=0\n");
            for test in tests {
                body.push_str(&format!(
                    "    run_tests {} {} || failed=1\n",
                    test.file, test.dir
                ));
            }
            body.push_str("    tests_outcome $failed\n");
            Ok(body)
        }
        "agents (simulated)" => Ok(format!(
            "    agents \"simulated executor\" {}\n",
            quoted(LIVE_AGENTS_SIMULATED)
        )),
        "agents (reference model)" => Ok(format!(
            "    agents \"reference model, wall clock\" {}\n",
            quoted(LIVE_AGENTS_REFERENCE)
        )),
        "bandwidth" => Ok(format!("    bandwidth {}\n", quoted(RESTORE_BENCH_ARGS))),
        other => Err(format!(
            "GPU_BUDGET's step `{other}` has no bundle step: add one to gpu_bundle::step_body"
        )),
    }
}

/// `run.sh`: the helpers, one function per step of `GPU_BUDGET`, and the calls that run them in order.
pub(crate) fn run_script(tests: &[BundledTest]) -> Result<String, String> {
    let total: u64 = GPU_BUDGET.iter().map(|(_, budget)| budget).sum();
    let mut steps = String::new();
    let mut calls = String::new();
    for (index, (step, budget)) in GPU_BUDGET.iter().enumerate() {
        steps.push_str(&format!(
            "# {step}\nstep_{index}() {{\n{}}}\n",
            step_body(step, tests)?
        ));
        calls.push_str(&format!(
            "run_step {index} \"{step}\" {budget} {}\n",
            log_name(index, step)
        ));
    }
    let functions: Vec<String> = (0..GPU_BUDGET.len())
        .map(|index| format!("step_{index}"))
        .collect();
    Ok(RUN_SH
        .replace("@TOTAL@", &total.to_string())
        .replace("@STEP_FUNCTIONS@", &functions.join(" "))
        .replace("@STEPS@", &steps)
        .replace("@CALLS@", &calls)
        .replace("@FILTER@", TEST_FILTER))
}

/// The script around the generated steps (`@STEPS@`, `@CALLS@`).
const RUN_SH: &str = include_str!("gpu_bundle/run.sh.in");

#[cfg(test)]
mod tests {
    use super::{BundledTest, GPU_BUDGET, log_name, run_script};

    fn some_tests() -> Vec<BundledTest> {
        vec![
            BundledTest {
                file: "kv-pool-lib".to_string(),
                dir: "crates/kv-pool".to_string(),
                n_selected: 5,
            },
            BundledTest {
                file: "engine-it".to_string(),
                dir: "crates/engine".to_string(),
                n_selected: 4,
            },
        ]
    }

    /// The steps `run.sh` runs, as `(name, budget)`, read back from its `run_step` lines.
    fn steps_run(script: &str) -> Vec<(String, u64)> {
        script
            .lines()
            .filter_map(|line| line.strip_prefix("run_step "))
            .map(|rest| {
                let (_, rest) = rest.split_once(" \"").unwrap();
                let (name, rest) = rest.split_once("\" ").unwrap();
                let budget = rest.split(' ').next().unwrap().parse().unwrap();
                (name.to_string(), budget)
            })
            .collect()
    }

    #[test]
    fn run_sh_runs_exactly_the_steps_of_the_gpu_budget_in_order_with_their_budgets() {
        let script = run_script(&some_tests()).unwrap();
        let expected: Vec<(String, u64)> = GPU_BUDGET
            .iter()
            .map(|(step, budget)| (step.to_string(), *budget))
            .collect();
        assert_eq!(steps_run(&script), expected);
        for index in 0..GPU_BUDGET.len() {
            assert!(
                script.contains(&format!("\nstep_{index}() {{\n")),
                "step_{index}"
            );
        }
        let placeholder = script
            .match_indices('@')
            .find(|(at, _)| script[at + 1..].starts_with(|c: char| c.is_ascii_uppercase()));
        assert_eq!(placeholder, None, "a placeholder was left: {script}");
        // Every test binary is checked and run, from its package's folder.
        for test in some_tests() {
            assert!(script.contains(&format!(
                "check_listed {} {} {}",
                test.file, test.dir, test.n_selected
            )));
            assert!(script.contains(&format!("run_tests {} {}", test.file, test.dir)));
        }
    }

    #[test]
    fn run_sh_is_valid_bash() {
        let script = run_script(&some_tests()).unwrap();
        let dir = std::env::temp_dir().join(format!("kvgate-run-sh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.sh");
        std::fs::write(&path, script).unwrap();
        let checked = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            checked.status.success(),
            "{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    #[test]
    fn step_logs_are_named_in_letters_digits_and_dashes() {
        assert_eq!(log_name(0, "build"), "1-build");
        assert_eq!(
            log_name(3, "agents (reference model)"),
            "4-agents-reference-model"
        );
        for (index, (step, _)) in GPU_BUDGET.iter().enumerate() {
            let name = log_name(index, step);
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "{name}"
            );
        }
    }
}
