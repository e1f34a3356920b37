//! Tests of the scenario runner on hostile files: huge times, sizes and step counts are errors naming the
//! field and the limit, and an idle engine jumps to a late event instead of stepping to it.
#![allow(clippy::disallowed_methods, reason = "a test times a long idle run")]

use std::time::Instant;

use super::*;

fn scenario(text: &str) -> Scenario {
    serde_json::from_str(text).unwrap()
}

fn error(text: &str) -> String {
    run(&scenario(text)).unwrap_err().to_string()
}

#[test]
fn huge_times_are_refused_naming_the_field() {
    assert_eq!(
        error(r#"{"events": [{"at_step": 0, "do": {"advance_s": 1e300}}]}"#),
        "scenario : step 0: advance_s 1e300 is invalid; allowed: a number of seconds from 0 to 1e9"
    );
    assert_eq!(
        error(r#"{"events": [{"at_step": 0, "do": {"advance_s": -1}}]}"#),
        "scenario : step 0: advance_s -1 is invalid; allowed: a number of seconds from 0 to 1e9"
    );
    assert_eq!(
        error(
            r#"{"events": [{"at_step": 0, "do": {"copy_fault": {"delay_next": {"rank": 0, "by_s": 1e300}}}}]}"#
        ),
        "scenario : step 0: delay_next.by_s 1e300 is invalid; allowed: a number of seconds from 0 to 1e9"
    );
    assert!(
        error(r#"{"config": {"restore": {"max_wait_s": 1e300}}, "events": []}"#)
            .starts_with("config: `restore.max_wait_s` = 1e300 is out of range; allowed: a number of seconds from 0 to 1e9")
    );
}

#[test]
fn repeated_clock_jumps_never_overflow_the_clock() {
    let events: Vec<String> = (0..100)
        .map(|step| format!(r#"{{"at_step": {step}, "do": {{"advance_s": 1e9}}}}"#))
        .collect();
    let trace = run(&scenario(&format!(
        r#"{{"events": [{}]}}"#,
        events.join(",")
    )))
    .unwrap();
    let steps = trace["steps"].as_array().unwrap();
    assert_eq!(steps.last().unwrap()["now_s"], serde_json::json!(1e11));
}

#[test]
fn prompts_longer_than_the_model_are_refused_before_they_are_built() {
    assert_eq!(
        error(
            r#"{"events": [{"at_step": 0, "do": {"submit": {"id": 1, "new_tokens": 4294967295, "max_output_tokens": 1}}}]}"#
        ),
        "scenario : step 0: new_tokens 4294967295 makes a prompt of 4294967295 tokens, above \
         model.max_model_len 131072; use fewer tokens"
    );
    assert_eq!(
        error(
            r#"{"events": [{"at_step": 0, "do": {"resume": {"id": 1, "new_tokens": 1073741824, "max_output_tokens": 1}}}]}"#
        ),
        "scenario : step 0: resume.new_tokens 1073741824 makes a prompt of 1073741824 tokens, above \
         model.max_model_len 131072; use fewer tokens"
    );
}

#[test]
fn huge_pools_and_step_counts_are_refused_naming_the_limit() {
    assert_eq!(
        error(r#"{"max_steps": 4294967295, "events": []}"#),
        "scenario : max_steps 4294967295 is above the limit of 1000000; use fewer steps"
    );
    assert_eq!(
        error(r#"{"config": {"pool": {"pages": 4294967295}}, "events": []}"#),
        "config: `pool.pages` = 4294967295 is out of range; allowed: 1..=4194303"
    );
}

#[test]
fn an_idle_engine_jumps_to_a_late_event() {
    let started = Instant::now();
    let trace = run(&scenario(
        r#"{"max_steps": 1000000, "events": [
            {"at_step": 0, "do": {"submit": {"id": 1, "new_tokens": 32, "max_output_tokens": 2}}},
            {"at_step": 999999, "do": {"submit": {"id": 2, "new_tokens": 32, "max_output_tokens": 2}}}
        ]}"#,
    ))
    .unwrap();
    let steps: Vec<u64> = trace["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| step["step"].as_u64().unwrap())
        .collect();
    assert!(steps.len() < 20, "{steps:?}");
    assert!(steps.contains(&999_999), "{steps:?}");
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}

#[test]
fn a_model_preset_in_a_scenario_sets_the_geometry_as_in_a_config_file() {
    let parsed: Scenario = serde_json::from_str(
        r#"{ "config": { "model": { "preset": "linear-hybrid" } }, "events": [] }"#,
    )
    .unwrap();
    let preset = crate::config::model_preset("linear-hybrid").unwrap();
    assert_eq!(parsed.config.model.groups, preset.groups);
    let refused = serde_json::from_str::<Scenario>(
        r#"{ "config": { "model": { "preset": "linear-hybrid", "tokens_per_page": 32 } }, "events": [] }"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("a model preset sets model.tokens_per_page"),
        "{refused}"
    );
}
