//! `cargo xtask bench --grid`: `kvgate replay` (the release binary) over a grid of traces and pools under
//! every policy, each cell a process of its own run ALONE, one after another, never side by side; with
//! `/usr/bin/time` (Debian's `time` package) reporting each child's CPU time (user+sys) and peak RSS. Where
//! the peer harness is built (`../shared/peer/mocker-bench`; its binary at `$MOCKER_BENCH_BIN`, else where
//! its `run.sh` builds it), each (trace, pool) runs through it too and every policy's figures are given as a
//! ratio to the peer's. Medians of `--rounds` rounds (default 3), each round every cell once.
//!
//! Traces: the Mooncake conversation trace where `../shared` has it, else a generated trace of its shape
//! (named as such); and generated traces of four shapes (`kvgate trace generate`, seeded).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const POLICIES: [&str; 4] = ["ordinary", "pages-only", "reserved", "oracle"];
const POOLS: [u32; 2] = [8_192, 65_536];
const TIME_TOOL: &str = "/usr/bin/time";

/// A trace of the grid: its name, file and how it was made.
struct Trace {
    name: String,
    path: PathBuf,
    source: String,
}

/// One child's cost.
#[derive(Clone, Copy)]
struct Cost {
    cpu_s: f64,
    peak_rss_mb: f64,
}

/// A cell's figures: medians of its rounds' costs, and its (deterministic) report.
struct Cell {
    trace: String,
    pool_pages: u32,
    who: String,
    cpu_s: f64,
    peak_rss_mb: f64,
    from_cache_pct: f64,
    mean_ttft_s: Option<f64>,
}

pub(crate) fn run(rounds: usize, quick: bool, json: bool) -> Result<(), String> {
    if !Path::new(TIME_TOOL).is_file() {
        return Err(format!(
            "{TIME_TOOL} is missing: the grid measures each child with it (Debian package `time`)"
        ));
    }
    let root = crate::root();
    crate::cargo(&root, &["build", "--release", "--locked", "-p", "kvgate"])?;
    let kvgate = root.join("target/release/kvgate");
    let dir = root.join("target/bench-grid");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let traces = traces(&root, &kvgate, &dir, quick)?;
    let peer = peer_binary();
    match &peer {
        Some(path) => eprintln!("xtask: grid: the peer is {}", path.display()),
        None => eprintln!(
            "xtask: grid: no peer harness built (set MOCKER_BENCH_BIN): no ratios to the peer"
        ),
    }
    let mut costs: Vec<Vec<Cost>> = Vec::new();
    let mut reports: Vec<(String, u32, String, Value)> = Vec::new();
    for round in 1..=rounds {
        let mut idx = 0;
        for trace in &traces {
            for pool in POOLS {
                let mut whos: Vec<&str> = POLICIES.to_vec();
                if peer.is_some() {
                    whos.push("peer");
                }
                for who in whos {
                    eprintln!(
                        "xtask: grid round {round}/{rounds}: {} at {pool} pages, {who}",
                        trace.name
                    );
                    let (cost, report) = match (who, &peer) {
                        ("peer", Some(binary)) => run_peer(binary, trace, pool, &dir)?,
                        _ => run_kvgate(&kvgate, trace, pool, who, &dir)?,
                    };
                    if round == 1 {
                        costs.push(Vec::new());
                        reports.push((trace.name.clone(), pool, who.to_string(), report));
                    } else if let Some(first) = reports.get(idx) {
                        same_report(&first.3, &report, who)?;
                    }
                    if let Some(runs) = costs.get_mut(idx) {
                        runs.push(cost);
                    }
                    idx += 1;
                }
            }
        }
    }
    let cells: Vec<Cell> = reports
        .into_iter()
        .zip(costs)
        .map(|((trace, pool_pages, who, report), mut runs)| {
            cell(trace, pool_pages, who, &report, &mut runs)
        })
        .collect();
    print(&traces, &cells, rounds, json);
    Ok(())
}

/// The grid's traces: the conversation trace (shared, or generated in its shape) and four generated shapes.
fn traces(root: &Path, kvgate: &Path, dir: &Path, quick: bool) -> Result<Vec<Trace>, String> {
    let shared = root.join("../shared/workloads/mooncake/conversation_trace.jsonl");
    let mut traces = Vec::new();
    let scale = if quick { 10 } else { 1 };
    if shared.is_file() {
        traces.push(Trace {
            name: "conversation".to_string(),
            path: shared,
            source: "the Mooncake conversation trace (../shared, 12,031 requests)".to_string(),
        });
    } else {
        let requests = (12_031 / scale).to_string();
        let args = [
            "--requests",
            &requests,
            "--prompt",
            "long",
            "--reuse",
            "high",
            "--rate",
            "3.4",
        ];
        traces.push(generated(kvgate, dir, "conversation-like", &args)?);
    }
    // Each shape's name is its prompt, reuse and arrival knobs; short prompts at 20 requests a second,
    // long ones at 4 (the conversation trace's rate is 3.4).
    let shapes = [
        ("short-high-steady", 12_000),
        ("short-low-bursty", 12_000),
        ("long-high-bursty", 3_000),
        ("long-low-steady", 3_000),
    ];
    for (name, requests) in shapes {
        let knobs: Vec<&str> = name.split('-').collect();
        let (prompt, reuse, arrival) = match knobs.as_slice() {
            [prompt, reuse, arrival] => (*prompt, *reuse, *arrival),
            _ => return Err(format!("bad shape name {name}")),
        };
        let rate = if prompt == "short" { "20" } else { "4" };
        let requests = (requests / scale).to_string();
        let args = [
            "--requests",
            &requests,
            "--prompt",
            prompt,
            "--reuse",
            reuse,
            "--arrival",
            arrival,
            "--rate",
            rate,
        ];
        traces.push(generated(kvgate, dir, name, &args)?);
    }
    Ok(traces)
}

/// `kvgate trace generate --seed 0 ARGS` written to `dir/NAME.jsonl`.
fn generated(kvgate: &Path, dir: &Path, name: &str, args: &[&str]) -> Result<Trace, String> {
    let output = Command::new(kvgate)
        .args(["trace", "generate", "--seed", "0"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run kvgate trace generate: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "kvgate trace generate {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let path = dir.join(format!("{name}.jsonl"));
    std::fs::write(&path, &output.stdout)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Trace {
        name: name.to_string(),
        path,
        source: format!("kvgate trace generate --seed 0 {}", args.join(" ")),
    })
}

/// The peer harness's binary, when built: `$MOCKER_BENCH_BIN`, else where `run.sh` builds it.
fn peer_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("MOCKER_BENCH_BIN").map(PathBuf::from),
        Some(std::env::temp_dir().join("mocker-bench-target/release/mocker-bench")),
    ];
    candidates.into_iter().flatten().find(|path| path.is_file())
}

/// `kvgate replay TRACE --pool-pages POOL --policy POLICY --json`: its cost and its one run's report.
fn run_kvgate(
    kvgate: &Path,
    trace: &Trace,
    pool: u32,
    policy: &str,
    dir: &Path,
) -> Result<(Cost, Value), String> {
    let mut command = Command::new(kvgate);
    command.arg("replay").arg(&trace.path).args([
        "--pool-pages",
        &pool.to_string(),
        "--policy",
        policy,
        "--json",
    ]);
    let (cost, stdout) = timed(&command, dir)?;
    let report: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("kvgate replay printed bad JSON: {e}"))?;
    let mut run = report["runs"][0].clone();
    if let Value::Object(map) = &mut run {
        map.remove("wall_seconds");
    }
    Ok((cost, run))
}

/// The peer harness on `trace` with `pool` blocks of 16 tokens: its cost and its hit figure.
fn run_peer(binary: &Path, trace: &Trace, pool: u32, dir: &Path) -> Result<(Cost, Value), String> {
    let mut command = Command::new(binary);
    command.arg(&trace.path).arg(pool.to_string());
    let (cost, stdout) = timed(&command, dir)?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("the peer printed no JSON line")?;
    let report: Value =
        serde_json::from_str(line).map_err(|e| format!("the peer printed bad JSON: {e}"))?;
    let hit = report["hit_percent_first_admission"].clone();
    let completed = report["completed_requests"].clone();
    Ok((
        cost,
        json!({"prompt_tokens_from_cache_pct": hit, "completed_requests": completed}),
    ))
}

/// Runs `command` alone under `/usr/bin/time`: its CPU time and peak RSS, and its stdout (its stderr, warnings
/// of a run under pressure, is dropped).
fn timed(command: &Command, dir: &Path) -> Result<(Cost, String), String> {
    let figures = dir.join("time.txt");
    let output = Command::new(TIME_TOOL)
        .args(["-f", "%U %S %M", "-o"])
        .arg(&figures)
        .arg(command.get_program())
        .args(command.get_args())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {TIME_TOOL}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed ({}); run it alone to see its stderr",
            output.status
        ));
    }
    let text = std::fs::read_to_string(&figures)
        .map_err(|e| format!("cannot read {}: {e}", figures.display()))?;
    let numbers: Vec<f64> = text
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    let [user_s, sys_s, rss_kb] = numbers[..] else {
        return Err(format!("{TIME_TOOL} wrote {text:?}"));
    };
    let cost = Cost {
        cpu_s: user_s + sys_s,
        peak_rss_mb: rss_kb * 1024.0 / 1e6,
    };
    Ok((cost, String::from_utf8_lossy(&output.stdout).into_owned()))
}

/// A deterministic report must repeat round after round; anything else is a bug to look at.
fn same_report(first: &Value, again: &Value, who: &str) -> Result<(), String> {
    if who == "peer" || first == again {
        return Ok(());
    }
    Err(format!(
        "{who}: the report changed between rounds:\n{first}\n{again}"
    ))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn cell(trace: String, pool_pages: u32, who: String, report: &Value, runs: &mut [Cost]) -> Cell {
    let mut cpu: Vec<f64> = runs.iter().map(|c| c.cpu_s).collect();
    let mut rss: Vec<f64> = runs.iter().map(|c| c.peak_rss_mb).collect();
    Cell {
        trace,
        pool_pages,
        who,
        cpu_s: median(&mut cpu),
        peak_rss_mb: median(&mut rss),
        from_cache_pct: report["prompt_tokens_from_cache_pct"]
            .as_f64()
            .unwrap_or(f64::NAN),
        mean_ttft_s: report["mean_ttft_s"].as_f64(),
    }
}

/// Issue 34's targets a cell misses: above the peer's CPU time or memory; for `reserved`, below
/// `ordinary`'s cache share or above its mean time to first token.
fn misses(cell: &Cell, peer: Option<&Cell>, ordinary: Option<&Cell>) -> Vec<&'static str> {
    let mut missed = Vec::new();
    if let Some(peer) = peer.filter(|_| cell.who != "peer") {
        if cell.cpu_s > peer.cpu_s {
            missed.push("cpu");
        }
        if cell.peak_rss_mb > peer.peak_rss_mb {
            missed.push("memory");
        }
    }
    if let (Some(ordinary), "reserved") = (ordinary, cell.who.as_str()) {
        if cell.from_cache_pct < ordinary.from_cache_pct {
            missed.push("cache share");
        }
        if cell.mean_ttft_s > ordinary.mean_ttft_s {
            missed.push("mean ttft");
        }
    }
    missed
}

fn print(traces: &[Trace], cells: &[Cell], rounds: usize, json: bool) {
    let find = |cell: &Cell, who: &str| {
        cells
            .iter()
            .find(|c| c.trace == cell.trace && c.pool_pages == cell.pool_pages && c.who == who)
    };
    let ratio = |a: f64, b: Option<f64>| b.map(|b| a / b);
    let mut rows = Vec::new();
    println!("traces:");
    for trace in traces {
        println!("- {}: {}", trace.name, trace.source);
    }
    println!(
        "\nmedians of {rounds} round(s), each cell alone\n\n| trace | pages | policy | CPU s | peak RSS MB | \
         CPU / peer | RSS / peer | from cache % | mean TTFT s | misses |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for cell in cells {
        let peer = find(cell, "peer");
        let missed = misses(cell, peer, find(cell, "ordinary"));
        let cpu_ratio = ratio(cell.cpu_s, peer.map(|p| p.cpu_s));
        let rss_ratio = ratio(cell.peak_rss_mb, peer.map(|p| p.peak_rss_mb));
        let show = |value: Option<f64>, digits: usize| {
            value.map_or("-".to_string(), |v| format!("{v:.digits$}"))
        };
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} | {:.2} | {} | {} |",
            cell.trace,
            cell.pool_pages,
            cell.who,
            cell.cpu_s,
            cell.peak_rss_mb,
            show(cpu_ratio, 2),
            show(rss_ratio, 2),
            cell.from_cache_pct,
            show(cell.mean_ttft_s, 1),
            missed.join(", ")
        );
        rows.push(json!({
            "trace": cell.trace, "pool_pages": cell.pool_pages, "policy": cell.who,
            "cpu_s": cell.cpu_s, "peak_rss_mb": cell.peak_rss_mb, "cpu_over_peer": cpu_ratio,
            "rss_over_peer": rss_ratio, "from_cache_pct": cell.from_cache_pct,
            "mean_ttft_s": cell.mean_ttft_s, "misses": missed,
        }));
    }
    if json {
        println!("{}", json!({"grid": rows, "machine": super::machine()}));
    } else {
        println!("\nmachine: {}", super::machine());
    }
}
