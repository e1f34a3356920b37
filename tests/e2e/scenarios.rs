//! Every scenario file under `tests/scenarios/` runs to a trace that matches its snapshot. A scenario's
//! description says which contract behaviour it shows; the snapshot is the reviewed trace.

use kvgate::scenario::{Scenario, run};

use crate::{repo_root, without_wall_time};

fn check(name: &str) {
    let path = repo_root()
        .join("tests/scenarios")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut scenario: Scenario =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Every restore of the trace is verified against recompute (L5), in release builds too.
    scenario.config.restore.verify = true;
    let trace = without_wall_time(run(&scenario).unwrap_or_else(|e| panic!("{name}: {e}")));
    insta::with_settings!({ snapshot_path => repo_root().join("tests/snapshots"), prepend_module_to_snapshot => false }, {
        insta::assert_json_snapshot!(name, trace);
    });
}

#[test]
fn bounded_wait_expires() {
    check("bounded_wait_expires");
}

#[test]
fn cancel_while_copying() {
    check("cancel_while_copying");
}

#[test]
fn capacity_wait() {
    check("capacity_wait");
}

#[test]
fn copy_failure_retries() {
    check("copy_failure_retries");
}

#[test]
fn non_forced_reset_refused() {
    check("non_forced_reset_refused");
}

#[test]
fn ordinary_recomputes_under_pressure() {
    check("ordinary_recomputes_under_pressure");
}

#[test]
fn restore_after_reset() {
    check("restore_after_reset");
}

#[test]
fn streaming_resume() {
    check("streaming_resume");
}

#[test]
fn every_scenario_file_has_a_test() {
    let dir = repo_root().join("tests/scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".json")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    let source = include_str!("scenarios.rs");
    for name in names {
        assert!(
            source.contains(&format!("check(\"{name}\")")),
            "tests/scenarios/{name}.json has no test"
        );
    }
}

#[test]
fn sliding_window_recycling() {
    check("sliding_window_recycling");
}

#[test]
fn two_rank_copy_failure() {
    check("two_rank_copy_failure");
}
