//! `cargo xtask bench`: runs every benchmark target of the workspace (each lives next to the code it
//! measures, as `benches/*.rs` with `harness = false`, and prints one JSON object of figures on stdout) and
//! merges their figures into one JSON object, with the machine they were measured on. `--grid` instead runs
//! the replay grid (`grid`): traces and pools under every policy, each cell alone, against the peer.

use std::process::{Command, Stdio};

use serde_json::{Map, Value};

mod grid;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut json = false;
    let mut grid = false;
    let mut rounds = 3;
    let mut quick = false;
    let mut pass_through = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--grid" => grid = true,
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| (1..=100).contains(&n))
                    .ok_or("--rounds takes a number of rounds from 1 to 100")?;
            }
            "--gpu" => pass_through.push("--gpu".to_string()),
            "--quick" => {
                quick = true;
                pass_through.push("--quick".to_string());
            }
            other => {
                return Err(format!(
                    "unknown bench option `{other}` (known: --json, --gpu, --quick, --grid, --rounds N)"
                ));
            }
        }
    }
    if grid {
        return grid::run(rounds, quick, json);
    }
    let root = crate::root();
    let mut figures = Map::new();
    for (package, target) in bench_targets(&root)? {
        eprintln!("xtask: bench {package}/{target}");
        let mut command = Command::new(crate::cargo_bin());
        command
            .args([
                "bench", "--quiet", "--locked", "-p", &package, "--bench", &target, "--",
            ])
            .args(&pass_through)
            .current_dir(&root)
            .stderr(Stdio::inherit());
        let output = command
            .output()
            .map_err(|e| format!("cannot run cargo bench: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "benchmark {package}/{target} failed ({})",
                output.status
            ));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| {
                format!("benchmark {package}/{target} printed no JSON object on stdout")
            })?;
        let object: Map<String, Value> = serde_json::from_str(line)
            .map_err(|e| format!("benchmark {package}/{target} printed bad JSON: {e}"))?;
        for (key, value) in object {
            if figures.insert(key.clone(), value).is_some() {
                return Err(format!("benchmark figure `{key}` is reported twice"));
            }
        }
    }
    figures.insert("machine".to_string(), Value::String(machine()));
    if json {
        println!("{}", Value::Object(figures));
    } else {
        let width = figures.keys().map(String::len).max().unwrap_or(0);
        for (key, value) in &figures {
            println!("{key:<width$}  {value}");
        }
    }
    Ok(())
}

/// `(package, bench target)` for every bench target in the workspace, in a stable order.
fn bench_targets(root: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let output = Command::new(crate::cargo_bin())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed bad JSON: {e}"))?;
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let is_bench = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k == "bench");
            if is_bench {
                targets.push((
                    package["name"].as_str().unwrap_or_default().to_string(),
                    target["name"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    targets.sort();
    Ok(targets)
}

/// A one-line description of this machine: CPU model, cores and memory.
pub(crate) fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split(':').nth(1))
        })
        .map_or("unknown cpu", str::trim)
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("{model}, {cores} cores, {mem_gib:.0} GiB")
}
