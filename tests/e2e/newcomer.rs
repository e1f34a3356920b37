//! What a new user runs first, through the binary: the README's deterministic figures reproduce; a config
//! printed with `--print-config` reads back to the same config and the same run (the documented example and
//! every preset); `/metrics` stays up for `--metrics-linger` after a replay and holds the report's counts; a
//! persistent store that starts warm is named in the report, which drops the cold-store ceiling.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{repo_root, without_wall_time};

/// Runs the binary: (success, stdout, stderr).
fn kvgate(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(crate::kvgate_exe())
        .args(args)
        .env_remove("KVGATE_RESTORE_MAX_WAIT_S")
        .output()
        .expect("the binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_of(args: &[&str]) -> Value {
    let (ok, stdout, stderr) = kvgate(args);
    assert!(ok, "{args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// The cells of a text table's row, by its label (columns are separated by two spaces or more).
fn cells(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|cell| !cell.is_empty())
        .map(str::to_string)
        .collect()
}

/// The first fenced block of `text` after the line holding `marker`.
fn block_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    let from = text
        .find(marker)
        .unwrap_or_else(|| panic!("README has no {marker:?}"));
    text[from..]
        .lines()
        .skip_while(|line| !line.starts_with("```"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .collect()
}

#[test]
fn the_readme_agents_table_is_what_the_default_run_prints() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let shown = block_after(&readme, "What it prints");
    let (ok, printed, stderr) = kvgate(&["agents", "--verify"]);
    assert!(ok, "{stderr}");
    let printed_rows: Vec<Vec<String>> = printed.lines().map(cells).collect();
    // The header line names the policies in the same order; each row of the README is the run's row (the
    // README's columns are narrower: a label may be followed by one space only).
    assert_eq!(
        cells(shown[0]),
        ["ordinary", "pages-only", "reserved", "oracle"]
    );
    let mut compared = 0;
    for line in &shown[1..] {
        let line = line.trim();
        let run_row = printed_rows
            .iter()
            .filter(|cells| {
                cells
                    .first()
                    .is_some_and(|label| line.starts_with(label.as_str()))
            })
            .max_by_key(|cells| cells[0].len())
            .unwrap_or_else(|| panic!("the run prints no row for {line:?}:\n{printed}"));
        let label = &run_row[0];
        let shown_cells = cells(&line[label.len()..]);
        assert_eq!(
            shown_cells[..],
            run_row[1..],
            "README row {label:?} against the run:\n{printed}"
        );
        compared += 1;
    }
    assert!(compared >= 8, "{compared} rows compared");
    // The ceiling the README quotes for the presets is the run's.
    assert!(
        printed.contains("the workload allows at most 98.8% from cache"),
        "{printed}"
    );
}

#[test]
fn the_readme_preset_table_is_what_the_preset_runs_give() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let shown = block_after(&readme, "Prompt tokens from cache (each rank's pool");
    assert!(cells(shown[0])[0] == "preset", "{shown:?}");
    for line in &shown[1..] {
        let row = cells(line);
        let report = json_of(&["agents", "--preset", &row[0], "--json"]);
        let runs = report["runs"].as_array().unwrap();
        let pct = |policy: &str| {
            let run = runs.iter().find(|run| run["policy"] == policy).unwrap();
            format!(
                "{:.1}%",
                run["prompt_tokens_from_cache_pct"].as_f64().unwrap()
            )
        };
        assert_eq!(
            row[1..5],
            [
                pct("ordinary"),
                pct("pages-only"),
                pct("reserved"),
                pct("oracle")
            ],
            "{}",
            row[0]
        );
        let reserved = runs.iter().find(|run| run["policy"] == "reserved").unwrap();
        assert_eq!(
            row[5],
            format!(
                "{}/{} / {}, {}",
                reserved["later_turns_restored"],
                reserved["later_turns"],
                reserved["later_turns_local_hit"],
                reserved["leaked_pages"]
            ),
            "{}",
            row[0]
        );
    }
}

/// `--print-config` of `args`, written to `dir/name`, and that file's own `--print-config`: the same text.
fn printed_config(dir: &std::path::Path, name: &str, args: &[&str]) -> std::path::PathBuf {
    let mut with = vec!["agents", "--print-config"];
    with.extend_from_slice(args);
    let (ok, text, stderr) = kvgate(&with);
    assert!(ok, "{args:?}: {stderr}");
    let path = dir.join(name);
    std::fs::write(&path, &text).unwrap();
    let (ok, again, stderr) = kvgate(&[
        "agents",
        "--print-config",
        "--config",
        path.to_str().unwrap(),
    ]);
    assert!(
        ok,
        "{args:?} printed a config that does not load: {stderr}\n{text}"
    );
    assert_eq!(text, again, "{args:?}");
    path
}

#[test]
fn a_printed_config_reads_back_to_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let small = ["--agents", "3", "--turns", "3", "--json", "--verify"];
    let documented = repo_root().join("docs/kvgate.toml");
    let documented = documented.to_str().unwrap();
    let mut cases: Vec<(String, Vec<&str>)> = vec![
        ("default".to_string(), vec![]),
        ("documented".to_string(), vec!["--config", documented]),
        (
            "pool".to_string(),
            vec!["--pool-pages", "300", "--seed", "4"],
        ),
    ];
    for preset in kvgate::MODEL_PRESETS.iter().chain(&["glm-like-moe"]) {
        cases.push((preset.to_string(), vec!["--preset", preset]));
    }
    for (name, args) in &cases {
        let path = printed_config(dir.path(), &format!("{name}.toml"), args);
        let text = std::fs::read_to_string(&path).unwrap();
        // The command sizes the pool unless told: the printed config does not pin it.
        assert_eq!(
            text.lines().any(|line| line.starts_with("pages = ")),
            args.contains(&"--pool-pages"),
            "{name}:\n{text}"
        );
        let mut direct = args.clone();
        direct.extend_from_slice(&small);
        let mut through = vec!["--config", path.to_str().unwrap()];
        through.extend_from_slice(&small);
        let mut direct_args = vec!["agents"];
        direct_args.extend_from_slice(&direct);
        let mut through_args = vec!["agents"];
        through_args.extend_from_slice(&through);
        assert_eq!(
            without_wall_time(json_of(&direct_args)),
            without_wall_time(json_of(&through_args)),
            "{name}"
        );
    }
}

/// A trace of `n` requests, one a second, each extending the one before (a conversation).
fn conversation_trace(dir: &std::path::Path, n: u32) -> std::path::PathBuf {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let ids: Vec<String> = (0..4 + i).map(|id| id.to_string()).collect();
            format!(
                r#"{{"timestamp": {}, "input_length": {}, "output_length": 8, "hash_ids": [{}]}}"#,
                i * 1000,
                (4 + i) * 512,
                ids.join(", ")
            )
        })
        .collect();
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// `GET /metrics` asking for the classic format: the body.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: test\r\nAccept: text/plain;version=0.0.4\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[test]
fn a_replay_keeps_its_metrics_up_for_the_linger_and_they_equal_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace = conversation_trace(dir.path(), 12);
    let mut child = Command::new(crate::kvgate_exe())
        .args(["replay", trace.to_str().unwrap(), "--json", "--verify"])
        .args(["--metrics-addr", "127.0.0.1:0", "--metrics-linger", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    // The address, then the line that says the run is over and the endpoint stays.
    while stderr.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line
            .trim()
            .strip_prefix("kvgate: serving metrics at http://")
        {
            addr = rest.strip_suffix("/metrics").map(str::to_string);
        }
        if line.contains("the run is over; metrics stay at") {
            break;
        }
        line.clear();
    }
    let addr = addr.expect("the address is named on stderr");
    let body = scrape(&addr);
    let _ignored = child.kill();
    let output = child.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    // A request a second: every policy's engine kept up, and the JSON says so.
    for policy in ["ordinary", "pages-only", "reserved", "oracle"] {
        assert_eq!(report["keep_up"][policy]["kept_up"], true, "{report}");
    }
    for run in report["runs"].as_array().unwrap() {
        let policy = run["policy"].as_str().unwrap();
        let series = |name: &str, labels: &str| -> f64 {
            let key = format!("{name}{{policy=\"{policy}\"{labels}}} ");
            body.lines()
                .find_map(|line| line.strip_prefix(&key))
                .map_or(0.0, |value| value.parse().unwrap())
        };
        for source in ["local_hit", "restored", "recomputed"] {
            assert_eq!(
                series(
                    "kvgate_prompt_tokens_total",
                    &format!(",source=\"{source}\"")
                ),
                run[format!("prompt_tokens_{source}")].as_f64().unwrap(),
                "{policy} {source}"
            );
        }
        assert_eq!(
            series("kvgate_preemptions_total", ""),
            run["preemptions"].as_f64().unwrap(),
            "{policy}"
        );
        for (reason, n) in run["restore_fallbacks"].as_object().unwrap() {
            assert_eq!(
                series(
                    "kvgate_restore_fallbacks_total",
                    &format!(",reason=\"{reason}\"")
                ),
                n.as_f64().unwrap(),
                "{policy} {reason}"
            );
        }
    }
    assert!(
        body.contains("# TYPE kvgate_prompt_tokens_total counter"),
        "{body}"
    );
}

#[test]
fn metrics_options_out_of_place_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = conversation_trace(dir.path(), 2);
    let trace = trace.to_str().unwrap();
    let (ok, _, stderr) = kvgate(&["agents", "--metrics-linger", "5"]);
    assert!(!ok && stderr.contains("--metrics-addr"), "{stderr}");
    let (ok, _, stderr) = kvgate(&[
        "replay",
        trace,
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-linger=-1",
    ]);
    assert!(!ok && stderr.contains("--metrics-linger"), "{stderr}");
    let (ok, _, stderr) = kvgate(&[
        "replay",
        trace,
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-linger=2e9",
    ]);
    assert!(!ok && stderr.contains("--metrics-linger"), "{stderr}");
    let (ok, _, stderr) = kvgate(&[
        "replay",
        trace,
        "--engines",
        "2",
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    assert!(!ok && stderr.contains("--metrics-addr"), "{stderr}");
}

#[test]
fn a_warm_store_is_named_and_the_cold_ceiling_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let store = dir.path().join("store");
    std::fs::write(
        &config,
        format!("[store]\ndir = {:?}\n", store.to_str().unwrap()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let args = [
        "agents", "--config", config, "--agents", "2", "--turns", "2", "--verify",
    ];
    let (ok, first, stderr) = kvgate(&[&args[..], &["--policy", "reserved"]].concat());
    assert!(ok, "{stderr}");
    assert!(first.contains("started empty"), "{first}");
    assert!(first.contains("the workload allows at most"), "{first}");
    // The disk layout does not depend on --policy: one policy alone uses <dir>/<policy> too.
    assert!(store.join("reserved").join("LOCK").exists());
    let (ok, second, stderr) = kvgate(&[&args[..], &["--policy", "reserved"]].concat());
    assert!(ok, "{stderr}");
    assert!(second.contains("checkpoint store: disk ("), "{second}");
    assert!(second.contains("started warm"), "{second}");
    assert!(!second.contains("the workload allows at most"), "{second}");
    let report = json_of(&[&args[..], &["--json"]].concat());
    assert_eq!(report["store_started_warm"], true, "{report}");
    let reserved = &report["stores"]["reserved"];
    assert_eq!(reserved["kind"], "disk");
    assert!(reserved["checkpoints"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["stores"]["ordinary"]["checkpoints"], 0, "{report}");
    assert_eq!(report["seed"], 0);
    assert_eq!(report["preset"], "small-8b-gpu");
    assert!(report["pool_pages"].as_u64().unwrap() > 0);
}

#[test]
fn the_readme_turn_priority_figures_are_what_the_runs_give() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let figures = |priority: &str| -> (f64, f64, f64) {
        let report = json_of(&[
            "agents",
            "--policy",
            "reserved,oracle",
            "--turn-priority",
            priority,
            "--json",
        ]);
        let runs = report["runs"].as_array().unwrap();
        let field = |policy: &str, name: &str| {
            let run = runs.iter().find(|run| run["policy"] == policy).unwrap();
            run[name].as_f64().unwrap()
        };
        (
            field("reserved", "mean_turn_s"),
            field("oracle", "mean_turn_s"),
            field("reserved", "p99_ttft_s"),
        )
    };
    let (progress_mean, oracle_mean, progress_p99) = figures("progress");
    let (arrival_mean, _, arrival_p99) = figures("arrival");
    let claim = format!(
        "`reserved`'s mean turn falls to {progress_mean:.1} s ({:.2}x the oracle's, against {:.1}x)",
        progress_mean / oracle_mean,
        arrival_mean / oracle_mean
    );
    assert!(readme.contains(&claim), "README lacks {claim:?}");
    let tail = format!("(p99 time to first token {progress_p99:.1} s against {arrival_p99:.1} s");
    assert!(readme.contains(&tail), "README lacks {tail:?}");
}
