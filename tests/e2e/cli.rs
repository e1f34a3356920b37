//! The `kvgate` binary on bad input: every mistake is an error message naming the problem and a non-zero
//! exit, never a panic.

use std::process::Command;

use crate::repo_root;

/// Runs the binary and returns (success, stdout, stderr).
fn kvgate(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_kvgate"))
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
        "agents: `turns` must be at least 1, got 0",
    );
}

#[test]
fn a_bad_environment_override_is_named() {
    let output = Command::new(env!("CARGO_BIN_EXE_kvgate"))
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
    let (ok, stdout, stderr) = kvgate(&["scenario", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let trace: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        trace["steps"]
            .as_array()
            .is_some_and(|steps| !steps.is_empty())
    );
}
