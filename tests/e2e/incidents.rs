//! The ported upstream incidents (`tests/scenarios/incidents/`, issue 32): every case passes under every
//! policy it names, restores verified against recompute, and a case whose expectation is wrong fails with a
//! line naming it, through the library and through `kvgate scenario --suite`.

use std::collections::BTreeSet;
use std::process::Command;

use kvgate::scenario::suite::{report, run_suite};

use crate::repo_root;

#[test]
fn every_ported_incident_passes_under_every_policy_it_names() {
    let runs = run_suite(&repo_root().join("tests/scenarios/incidents")).unwrap();
    let failed: Vec<String> = runs
        .iter()
        .filter(|run| !run.passed())
        .map(|run| format!("{} ({}): {}", run.name, run.policy, run.failures.join("; ")))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let cases: BTreeSet<&str> = runs.iter().map(|run| run.name.as_str()).collect();
    assert!(cases.len() >= 12, "{} cases: {cases:?}", cases.len());
    for case in &cases {
        assert!(
            runs.iter()
                .any(|run| run.name == *case && run.policy == "reserved"),
            "{case} does not run under reserved"
        );
    }
    let sources: BTreeSet<&str> = runs.iter().map(|run| run.source.as_str()).collect();
    assert_eq!(sources.len(), cases.len(), "{sources:?}");
}

#[test]
fn a_case_whose_expectation_is_wrong_fails_naming_it() {
    let name = "vllm-57104-mtp-loads-fill-the-pool";
    let text =
        std::fs::read_to_string(repo_root().join(format!("tests/scenarios/incidents/{name}.json")))
            .unwrap();
    let mut case: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Under reserved the second restore waits and nothing is preempted: expecting a preemption is wrong.
    case["expect"]["reserved"]["metrics"]["preemptions"] = serde_json::json!(1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(format!("{name}.json")),
        serde_json::to_string_pretty(&case).unwrap(),
    )
    .unwrap();

    let runs = run_suite(dir.path()).unwrap();
    let failed: Vec<_> = runs.iter().filter(|run| !run.passed()).collect();
    assert_eq!(failed.len(), 1, "{runs:?}");
    assert_eq!(
        (failed[0].name.as_str(), failed[0].policy.as_str()),
        (name, "reserved")
    );
    assert_eq!(failed[0].failures, ["preemptions 0 (expected 1)"]);
    let lines = report(&runs);
    assert!(
        lines.lines().any(|line| line.starts_with("FAIL")
            && line.contains(name)
            && line.contains("vllm-project/vllm#57104")
            && line.contains("preemptions 0 (expected 1)")),
        "{lines}"
    );

    let output = Command::new(crate::kvgate_exe())
        .args(["scenario", "--suite"])
        .arg(dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(!output.status.success(), "{stdout}");
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    assert!(
        stdout.contains(&format!("FAIL  {name}  reserved")),
        "{stdout}"
    );
    assert!(
        stderr.contains("1 of 3 case runs failed") && stderr.contains(name),
        "{stderr}"
    );
}

#[test]
fn a_suite_case_without_its_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bare.json"),
        r#"{"events": [], "expect": {"reserved": {}}}"#,
    )
    .unwrap();
    let runs = run_suite(dir.path()).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        runs[0].failures,
        ["a suite case needs source, symptom, contract; see docs/scenarios.md"]
    );
}
