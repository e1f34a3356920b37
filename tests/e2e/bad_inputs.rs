//! The corpus of hostile inputs (`tests/bad_inputs/cases.toml`, plus inputs too large to commit, generated
//! here): every one makes the `kvgate` binary exit non-zero within a time bound with an error naming the
//! problem, never a panic, an out-of-memory abort or a hang.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::repo_root;

/// The longest a case may run. Every case fails at once; a hang or a huge allocation shows up here.
const CASE_SECONDS_MAX: u64 = 20;

/// The variable every case runs without unless it sets it.
const WAIT_ENV: &str = "KVGATE_RESTORE_MAX_WAIT_S";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Corpus {
    case: Vec<Case>,
}

/// One input: the command line, environment variables to add, and what stderr must say.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    expect: String,
}

/// How a run ended.
struct Outcome {
    success: bool,
    stderr: String,
    elapsed: Duration,
}

/// Runs the binary with `args` and `env`, killing it after [`CASE_SECONDS_MAX`]; `None` when it was killed.
fn run(args: &[String], env: &BTreeMap<String, String>) -> Option<Outcome> {
    let started = Instant::now();
    let mut command = Command::new(crate::kvgate_exe());
    command
        .args(args)
        .env_remove(WAIT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("the binary starts");
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        stderr_pipe.read_to_end(&mut text).map(|_| text)
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(CASE_SECONDS_MAX) {
            child.kill().expect("a running child can be killed");
            child.wait().expect("a killed child can be waited for");
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = reader
        .join()
        .expect("the reader thread")
        .expect("stderr reads");
    status.map(|status| Outcome {
        success: status.success(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        elapsed: started.elapsed(),
    })
}

/// What is wrong with how `case` ran, if anything.
fn check(case: &Case) -> Option<String> {
    let Case {
        name,
        args,
        env,
        expect,
    } = case;
    let Some(outcome) = run(args, env) else {
        return Some(format!(
            "{name}: still running after {CASE_SECONDS_MAX} s ({args:?})"
        ));
    };
    let stderr = &outcome.stderr;
    if outcome.success {
        return Some(format!("{name}: exited 0 ({args:?}); stderr {stderr:?}"));
    }
    if stderr.contains("panicked") {
        return Some(format!("{name}: panicked ({args:?}): {stderr}"));
    }
    if !stderr.contains(expect.as_str()) {
        return Some(format!(
            "{name}: stderr lacks {expect:?} ({args:?}): {stderr:?}"
        ));
    }
    if stderr.len() > 4096 {
        return Some(format!(
            "{name}: stderr is {} bytes long; an error message stays short",
            stderr.len()
        ));
    }
    None
}

/// Writes `bytes` to `dir/name` in chunks and returns the path as a string.
fn write_input(dir: &Path, name: &str, chunks: impl Iterator<Item = Vec<u8>>) -> String {
    let path = dir.join(name);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("temp file"));
    for chunk in chunks {
        file.write_all(&chunk).expect("temp file writes");
    }
    file.flush().expect("temp file flushes");
    path.to_str().expect("a UTF-8 temp path").to_string()
}

/// The inputs too large to commit, written into `dir`.
fn generated_cases(dir: &Path) -> Vec<Case> {
    // A 70 MB trace line: the reader must refuse it at 1 MiB, not allocate it (or 16 GiB of tokens).
    let head =
        br#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1"#.to_vec();
    let body = (0..70).map(|_| b", 1".repeat((1 << 20) / 3));
    let long_line = write_input(
        dir,
        "long_line.jsonl",
        std::iter::once(head)
            .chain(body)
            .chain(std::iter::once(b"]}\n".to_vec())),
    );
    let preset = write_input(
        dir,
        "huge_preset.toml",
        [format!("[model]\npreset = \"{}\"\n", "x".repeat(1 << 20)).into_bytes()].into_iter(),
    );
    let not_utf8 = write_input(
        dir,
        "not_utf8.toml",
        [b"[pool]\npages = \xff\xfe\n".to_vec()].into_iter(),
    );
    let agents = |config: &str| {
        [
            "agents", "--agents", "1", "--turns", "1", "--config", config,
        ]
        .map(String::from)
        .to_vec()
    };
    let case = |name: &str, args: Vec<String>, env: &[(&str, String)], expect: &str| Case {
        name: name.to_string(),
        args,
        env: env
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect(),
        expect: expect.to_string(),
    };
    vec![
        case(
            "trace with a 70 MB line",
            vec!["replay".into(), long_line],
            &[],
            "long_line.jsonl:1: the line is longer than the limit of 1048576 bytes",
        ),
        case(
            "config with a 1 MiB preset name",
            agents(&preset),
            &[],
            "`model.preset` = xxxxxxxx",
        ),
        case(
            "config that is not UTF-8",
            agents(&not_utf8),
            &[],
            "stream did not contain valid UTF-8",
        ),
        case(
            "KVGATE_RESTORE_MAX_WAIT_S of 100 kB",
            ["agents", "--agents", "1", "--turns", "1"]
                .map(String::from)
                .to_vec(),
            &[(WAIT_ENV, "1".repeat(100_000))],
            "environment: KVGATE_RESTORE_MAX_WAIT_S=\"1111",
        ),
    ]
}

#[test]
fn every_hostile_input_is_a_named_error_and_a_non_zero_exit() {
    let corpus_dir = repo_root().join("tests/bad_inputs");
    let text = std::fs::read_to_string(corpus_dir.join("cases.toml")).expect("the corpus manifest");
    let corpus: Corpus = toml::from_str(&text).expect("the corpus manifest parses");
    let corpus_path = corpus_dir.to_str().expect("a UTF-8 repository path");
    let temp = tempfile::tempdir().expect("a temp dir");
    let mut cases: Vec<Case> = corpus
        .case
        .into_iter()
        .map(|case| Case {
            args: case
                .args
                .iter()
                .map(|arg| arg.replace("{corpus}", corpus_path))
                .collect(),
            ..case
        })
        .collect();
    assert!(cases.len() >= 100, "the corpus lost cases: {}", cases.len());
    cases.extend(generated_cases(temp.path()));
    let failures: Vec<String> = cases.iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} hostile inputs misbehaved:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn a_late_event_after_a_long_idle_stretch_runs_at_once() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let scenario = r#"{"max_steps": 1000000, "events": [
        {"at_step": 0, "do": {"submit": {"id": 1, "new_tokens": 32, "max_output_tokens": 2}}},
        {"at_step": 999990, "do": {"advance_s": 1e9}},
        {"at_step": 999990, "do": {"submit": {"id": 2, "new_tokens": 32, "max_output_tokens": 2}}}
    ]}"#;
    let path = write_input(
        temp.path(),
        "late.json",
        [scenario.as_bytes().to_vec()].into_iter(),
    );
    let outcome = run(&["scenario".to_string(), path], &BTreeMap::new()).expect("it finishes");
    assert!(outcome.success, "{}", outcome.stderr);
    assert!(
        outcome.elapsed < Duration::from_secs(5),
        "{:?}",
        outcome.elapsed
    );
}
