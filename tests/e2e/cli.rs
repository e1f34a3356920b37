//! The `kvgate` binary on bad input: every mistake is an error message naming the problem and a non-zero
//! exit, never a panic.

use std::process::Command;

use crate::repo_root;

/// Runs the binary and returns (success, stdout, stderr).
fn kvgate(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(crate::kvgate_exe())
        .args(args)
        .output()
        .expect("the binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn temp_file(name: &str, text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), text).unwrap();
    dir
}

fn assert_fails_with(args: &[&str], expected: &str) {
    let (ok, _, stderr) = kvgate(args);
    assert!(!ok, "{args:?} succeeded");
    assert!(
        stderr.contains(expected),
        "{args:?}: stderr {stderr:?} lacks {expected:?}"
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
}

#[test]
fn missing_files_are_named() {
    assert_fails_with(
        &["scenario", "/nonexistent/s.json"],
        "kvgate: cannot read /nonexistent/s.json: ",
    );
    assert_fails_with(
        &["replay", "/nonexistent/t.jsonl"],
        "kvgate: cannot read trace /nonexistent/t.jsonl: ",
    );
    assert_fails_with(
        &["agents", "--config", "/nonexistent/c.toml"],
        "kvgate: cannot read /nonexistent/c.toml: ",
    );
}

#[test]
fn malformed_scenario_json_names_line_and_column() {
    let dir = temp_file(
        "s.json",
        "{\"events\": [\n  {\"at_step\": 0, \"do\": {\"submit\": {\"id\": 1}}}\n]}",
    );
    let path = dir.path().join("s.json");
    assert_fails_with(
        &["scenario", path.to_str().unwrap()],
        "missing field `new_tokens` at line 2",
    );
    let dir = temp_file("s.json", "{\"events\": [], \"colour\": 1}");
    let path = dir.path().join("s.json");
    assert_fails_with(
        &["scenario", path.to_str().unwrap()],
        "unknown field `colour`",
    );
}

#[test]
fn malformed_trace_line_is_named() {
    let dir = temp_file(
        "t.jsonl",
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n",
    );
    let path = dir.path().join("t.jsonl");
    assert_fails_with(&["replay", path.to_str().unwrap()], "t.jsonl:2: ");
    assert_fails_with(
        &["replay", path.to_str().unwrap(), "--time-scale", "0"],
        "kvgate: --time-scale 0 is invalid; allowed: a number above 0, at most 1e6",
    );
}

#[test]
fn invalid_config_values_name_the_field() {
    let dir = temp_file("c.toml", "[scheduler]\nmax_running = 0\n");
    let path = dir.path().join("c.toml");
    assert_fails_with(
        &["agents", "--config", path.to_str().unwrap()],
        "config: `scheduler.max_running` = 0 is out of range; allowed: 1..=1048576",
    );
    assert_fails_with(
        &["agents", "--pool-pages", "0"],
        "`pool.pages` = 0 is out of range",
    );
    assert_fails_with(
        &["agents", "--preset", "gpt-9"],
        "`model.preset` = gpt-9 is out of range",
    );
    assert_fails_with(&["agents", "--policy", "greedy"], "greedy");
    assert_fails_with(
        &["agents", "--turns", "0"],
        "agents: `turns` (--turns) must be at least 1, got 0",
    );
}

#[test]
fn a_bad_environment_override_is_named() {
    let output = Command::new(crate::kvgate_exe())
        .args(["agents", "--agents", "1", "--turns", "1"])
        .env("KVGATE_RESTORE_MAX_WAIT_S", "soon")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("KVGATE_RESTORE_MAX_WAIT_S=\"soon\" is invalid"),
        "{stderr}"
    );
}

#[test]
fn the_shipped_scenarios_run_from_the_command_line() {
    let path = repo_root().join("tests/scenarios/restore_after_reset.json");
    let (ok, stdout, stderr) = kvgate(&["scenario", path.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    let trace: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        trace["steps"]
            .as_array()
            .is_some_and(|steps| !steps.is_empty())
    );
    // Without --json: a short summary naming each request's phases and the metrics.
    let (ok, summary, stderr) = kvgate(&["scenario", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(summary.lines().count() < 20, "{summary}");
    assert!(summary.contains("policy reserved, "), "{summary}");
    assert!(summary.contains("request 1: "), "{summary}");
    assert!(summary.contains("leaked pages 0"), "{summary}");
    assert!(summary.ends_with("(--json prints the per-step trace; docs/scenarios.md)\n"));
}

#[test]
fn a_scenario_runs_on_every_model_preset_from_the_command_line() {
    let path = repo_root().join("tests/scenarios/restore_after_reset.json");
    for preset in kvgate::MODEL_PRESETS {
        let (ok, stdout, stderr) = kvgate(&[
            "scenario",
            path.to_str().unwrap(),
            "--preset",
            preset,
            "--json",
        ]);
        assert!(ok, "{preset}: {stderr}");
        let trace: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(trace["metrics"]["leaked_pages"], 0, "{preset}");
    }
}

#[test]
fn an_invalid_log_filter_is_an_error_naming_the_variable() {
    let output = Command::new(crate::kvgate_exe())
        .args(["agents", "--agents", "1", "--turns", "1"])
        .env("KVGATE_LOG", "kvgate=loud")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("kvgate: environment: KVGATE_LOG=\"kvgate=loud\" is invalid; allowed: "),
        "{stderr}"
    );
}

/// A store directory in `dir` (`[store] dir`) and the config file naming it.
fn store_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("c.toml");
    let store = dir.join("store");
    std::fs::write(
        &config,
        format!("[store]\ndir = {:?}\n", store.to_str().unwrap()),
    )
    .unwrap();
    config
}

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_config(dir.path());
    // A foreign manifest: opening the store warns that it is skipped.
    std::fs::create_dir_all(dir.path().join("store/reserved")).unwrap();
    std::fs::write(
        dir.path().join("store/reserved/ckpt-61.manifest"),
        b"foreign",
    )
    .unwrap();
    let output = Command::new(crate::kvgate_exe())
        .args(["agents", "--config", config.to_str().unwrap()])
        .args([
            "--policy", "reserved", "--agents", "1", "--turns", "1", "--verify",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("checkpoint file rejected, skipped"),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "colour codes in {stderr:?}");
}

#[test]
fn policies_run_at_once_each_keep_their_own_store_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_config(dir.path());
    let args = [
        "agents",
        "--config",
        config.to_str().unwrap(),
        "--agents",
        "2",
        "--turns",
        "2",
        "--json",
        "--verify",
    ];
    // Twice: the second run reopens what the first left, policy by policy.
    for run in 0..2 {
        let (ok, stdout, stderr) = kvgate(&args);
        assert!(ok, "run {run}: {stderr}");
        assert!(!stderr.contains("WARN"), "run {run}: {stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 4);
        for policy_run in runs {
            assert_eq!(policy_run["store_write_failures"], 0, "{policy_run}");
        }
    }
    for policy in ["ordinary", "pages-only", "reserved", "oracle"] {
        let store = dir.path().join("store").join(policy);
        let names: Vec<String> = std::fs::read_dir(&store)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&"LOCK".to_string()), "{policy}: {names:?}");
        assert!(
            names.iter().any(|name| name.ends_with(".manifest")),
            "{policy} kept its checkpoints: {names:?}"
        );
    }
}

#[test]
fn k1_replay_rejects_requests_that_can_never_run_alone_and_counts_them() {
    // Two requests the model can never hold (longer than max_model_len, and 2^32 output tokens) between
    // ordinary ones: those two are rejected, the rest run, and the report counts the rejections by reason.
    let hash_ids = |n: u32, offset: u32| {
        (offset..offset + n)
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let lines = [
        format!(
            r#"{{"timestamp": 0, "input_length": 1000, "output_length": 8, "hash_ids": [{}]}}"#,
            hash_ids(2, 0)
        ),
        format!(
            r#"{{"timestamp": 10, "input_length": 200000, "output_length": 1, "hash_ids": [{}]}}"#,
            hash_ids(391, 100)
        ),
        format!(
            r#"{{"timestamp": 20, "input_length": 100, "output_length": 4294967295, "hash_ids": [{}]}}"#,
            hash_ids(1, 1000)
        ),
        format!(
            r#"{{"timestamp": 30, "input_length": 1000, "output_length": 8, "hash_ids": [{}]}}"#,
            hash_ids(2, 0)
        ),
    ];
    let dir = temp_file("t.jsonl", &(lines.join("\n") + "\n"));
    let trace = dir.path().join("t.jsonl");
    let (ok, stdout, stderr) = kvgate(&[
        "replay",
        trace.to_str().unwrap(),
        "--policy",
        "reserved",
        "--json",
        "--verify",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("request rejected"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let run = &report["runs"][0];
    assert_eq!(run["rejected_requests"]["longer_than_model"], 2, "{run}");
    assert_eq!(run["prompt_tokens"], 2000, "the two others ran: {run}");
}

#[test]
fn a_closed_output_pipe_ends_the_run_quietly() {
    // `kvgate agents | head -1`: the reader goes away before the table is written.
    let mut child = Command::new(crate::kvgate_exe())
        .args(["agents", "--agents", "2", "--turns", "2", "--verify"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("it ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

#[test]
fn l1_agents_runs_live_with_the_reference_executor_and_reserved_restores_every_later_turn() {
    let args = [
        "agents",
        "--executor",
        "reference",
        "--agents",
        "3",
        "--turns",
        "3",
        "--think-s",
        "0.05",
        "--pool-pages",
        "96",
        "--json",
        "--verify",
    ];
    let (ok, stdout, stderr) = kvgate(&args);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let pct = |policy: &str| {
        let run = runs.iter().find(|run| run["policy"] == policy).unwrap();
        assert_eq!(run["leaked_pages"], 0, "{run}");
        assert!(
            run["aggregate_decode_tok_s"].as_f64().unwrap() > 0.0,
            "{run}"
        );
        run["prompt_tokens_from_cache_pct"].as_f64().unwrap()
    };
    let reserved = runs.iter().find(|run| run["policy"] == "reserved").unwrap();
    // Every later turn comes from cache: restored, or a local hit (H9: the reference model keeps recurrent
    // state) where the session's boundary is still cached when the turn arrives, which the wall clock decides.
    let from_cache = reserved["later_turns_restored"].as_u64().unwrap()
        + reserved["later_turns_local_hit"].as_u64().unwrap();
    assert_eq!(from_cache, 6, "{reserved}");
    for policy in ["ordinary", "pages-only"] {
        assert!(pct("reserved") >= pct(policy), "{policy}: {stdout}");
    }
}

#[test]
fn l4_agents_runs_live_in_every_model_presets_shape_and_reserved_restores_every_later_turn() {
    // With the hybrid snapshots on (the default), a later turn finds its previous turn's boundary resident,
    // a local hit (H9) checked against a recompute like a restore; with them off (`state_snapshot_pages =
    // 0`), every later turn restores from the store.
    let no_snapshots = temp_file("c.toml", "[restore]\nstate_snapshot_pages = 0\n");
    let config = no_snapshots.path().join("c.toml");
    for preset in ["glm-mla-hybrid", "linear-hybrid", "sliding-window"] {
        for snapshots in [true, false] {
            let mut args = vec![
                "agents",
                "--executor",
                "reference",
                "--preset",
                preset,
                "--policy",
                "reserved",
                "--agents",
                "2",
                "--turns",
                "3",
                "--think-s",
                "0.05",
                "--json",
                "--verify",
            ];
            if !snapshots {
                args.extend(["--config", config.to_str().unwrap()]);
            }
            let (ok, stdout, stderr) = kvgate(&args);
            assert!(ok, "{preset}: {stderr}");
            let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let run = &report["runs"][0];
            assert_eq!(run["policy"], "reserved", "{preset}: {run}");
            // Every later turn is served from cache. With snapshots, whether a turn finds its boundary
            // resident or restores it is the wall clock's call (as in the L1 test); at least one hits.
            let (restored, local) = (
                run["later_turns_restored"].as_u64().unwrap(),
                run["later_turns_local_hit"].as_u64().unwrap(),
            );
            assert_eq!(restored + local, 4, "{preset}: {run}");
            if snapshots {
                assert!(local >= 1, "{preset}: no local hit with snapshots: {run}");
            } else {
                assert_eq!(local, 0, "{preset}: a local hit without snapshots: {run}");
            }
            assert_eq!(run["leaked_pages"], 0, "{preset}: {run}");
            assert_eq!(
                run["rejected_requests"],
                serde_json::json!({}),
                "{preset}: {run}"
            );
        }
    }
}

/// `GET /metrics` on `addr`: (status line, body).
fn scrape(addr: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The samples of a text-format exposition: series (name and labels as written) to value.
fn samples(text: &str) -> std::collections::HashMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "no EOF marker in {text}");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
            (name.to_string(), value)
        })
        .collect()
}

#[test]
fn a_live_agents_run_serves_metrics_while_it_runs_and_draws_its_chart() {
    use std::io::BufRead;
    let plot = tempfile::tempdir().unwrap();
    let mut child = Command::new(crate::kvgate_exe())
        .args([
            "agents",
            "--executor",
            "reference",
            "--policy",
            "reserved",
            "--agents",
            "3",
            "--turns",
            "3",
            "--think-s",
            "0.05",
            "--pool-pages",
            "96",
            "--metrics-addr",
            "127.0.0.1:0",
            "--json",
            "--plot",
        ])
        .arg(plot.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // The address is named on stderr; the rest of stderr (progress) is drained on a thread.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut text = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("kvgate: serving metrics at http://") {
                let _sent = addr_tx.send(rest.trim_end_matches("/metrics").to_string());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let addr = addr_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the metrics address is named on stderr");
    let mut while_running = None;
    while child.try_wait().unwrap().is_none() {
        let (status, body) = scrape(&addr);
        assert_eq!(status, "HTTP/1.1 200 OK");
        if body.contains("kvgate_pool_pages{") && child.try_wait().unwrap().is_none() {
            while_running = Some(samples(&body));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = drain.join().unwrap();
    assert!(output.status.success(), "{stderr}");
    let series = while_running.expect("/metrics was scraped while the live run ran");
    for family in [
        "kvgate_pool_pages{policy=\"reserved\",state=\"free\"}",
        "kvgate_copies_in_flight{policy=\"reserved\"}",
        "kvgate_capacity_waits_active{policy=\"reserved\"}",
    ] {
        assert!(series.contains_key(family), "no {family} in {series:?}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the report is JSON");
    assert_eq!(report["runs"][0]["policy"], "reserved");
    assert_eq!(report["runs"][0]["leaked_pages"], 0);
    let chart = std::fs::read_to_string(plot.path().join("agents.svg")).expect("the chart");
    assert!(chart.contains("reserved"), "the chart names the policy");
}

#[test]
fn an_agents_pool_comes_from_the_config_file_when_it_sets_one_else_from_the_run() {
    let pool_of = |config_text: &str| {
        let dir = temp_file("c.toml", config_text);
        let path = dir.path().join("c.toml");
        let (ok, stdout, stderr) = kvgate(&[
            "agents",
            "--config",
            path.to_str().unwrap(),
            "--agents",
            "1",
            "--turns",
            "1",
            "--policy",
            "reserved",
            "--verify",
        ]);
        assert!(ok, "{stderr}");
        stdout.lines().next().unwrap_or_default().to_string()
    };
    // Silent about the pool: the agents run's own (16384 tokens of 16-token pages), as without --config.
    let header = pool_of("seed = 1\n");
    assert!(header.contains("pool 1024 pages of 16 tokens"), "{header}");
    let header = pool_of("[pool]\npages = 300\n");
    assert!(header.contains("pool 300 pages of 16 tokens"), "{header}");
}

#[test]
#[allow(
    clippy::print_stderr,
    reason = "a GPU test says on stderr that it skipped and why"
)]
fn cuda_storage_on_the_command_line_runs_or_fails_naming_storage_without_a_driver() {
    let args = [
        "agents",
        "--agents",
        "2",
        "--turns",
        "2",
        "--policy",
        "reserved",
        "--storage",
        "cuda",
        "--copy-engine",
        "cuda",
        "--verify",
        "--json",
    ];
    let (ok, stdout, stderr) = kvgate(&args);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if stderr.contains("libcuda could not be loaded") || stderr.contains("no CUDA device") {
        assert!(!ok);
        assert!(
            std::env::var("KVGATE_REQUIRE_GPU").as_deref() != Ok("1"),
            "KVGATE_REQUIRE_GPU=1 but CUDA is unavailable: {stderr}"
        );
        assert!(
            stderr.contains("invalid engine parameter storage")
                && stderr.contains("use host storage"),
            "{stderr}"
        );
        eprintln!("skipped: the CUDA run: {stderr}");
    } else {
        assert!(ok, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(report["runs"][0]["leaked_pages"], 0, "{report}");
    }
}

/// An agents report says in which order its turns were admitted, in the table's header and in the JSON.
#[test]
fn an_agents_report_names_its_turn_priority() {
    let small = [
        "agents", "--agents", "2", "--turns", "2", "--policy", "reserved",
    ];
    for (order, header) in [
        ("arrival", None),
        ("progress", Some("turns admitted by session progress")),
    ] {
        let (ok, stdout, stderr) =
            kvgate(&[&small[..], &["--turn-priority", order, "--json"]].concat());
        assert!(ok, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("the report is JSON");
        assert_eq!(report["turn_priority"], order);
        let (ok, table, stderr) = kvgate(&[&small[..], &["--turn-priority", order]].concat());
        assert!(ok, "{stderr}");
        match header {
            Some(header) => assert!(table.contains(header), "{table}"),
            None => assert!(!table.contains("session progress"), "{table}"),
        }
    }
}

#[test]
fn agents_on_a_model_file_that_is_not_there_names_the_file_and_how_to_get_it() {
    let (ok, _stdout, stderr) = kvgate(&[
        "agents",
        "--executor",
        "model",
        "--model",
        "/nonexistent/model.gguf",
    ]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/model.gguf"), "{stderr}");
    assert!(stderr.contains("cargo xtask model"), "{stderr}");
}

#[test]
fn agents_on_a_file_that_is_not_a_model_says_so() {
    let dir = temp_file("bad.gguf", "not a gguf file at all");
    let path = dir.path().join("bad.gguf");
    let (ok, _stdout, stderr) = kvgate(&[
        "agents",
        "--executor",
        "model",
        "--model",
        path.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("not a GGUF file"), "{stderr}");
}

/// `--cost-model FILE` on agents (issue 31): the calibrated steps replace the preset's (the report names
/// them, and the recomputing policies' turns get faster: the calibrated prefill is about three times cheaper),
/// while the pool's geometry stays.
#[test]
fn agents_with_the_committed_cost_model_runs_the_calibrated_steps() {
    let file = repo_root().join("crates/kvgate/src/fidelity/h100-vllm.toml");
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["agents", "--turns", "12", "--policy", "ordinary", "--json"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = kvgate(&args);
        assert!(ok, "{args:?}: {stderr}");
        serde_json::from_str(&stdout).expect("the report is JSON")
    };
    let preset = run(&[]);
    let calibrated = run(&["--cost-model", file.to_str().expect("a UTF-8 path")]);
    let label = calibrated["preset"].as_str().unwrap_or_default();
    assert!(
        label.starts_with("small-8b-gpu (steps: --cost-model"),
        "{label}"
    );
    assert_eq!(preset["pool_pages"], calibrated["pool_pages"]);
    let turn = |v: &serde_json::Value| v["runs"][0]["mean_turn_s"].as_f64().expect("mean_turn_s");
    // 2.19 s against 1.98 s with the fit of 2026-12-04 (1.93 s with the first one; deterministic).
    assert!(
        turn(&calibrated) < 0.95 * turn(&preset),
        "calibrated {} s against the preset's {} s",
        turn(&calibrated),
        turn(&preset)
    );
}
