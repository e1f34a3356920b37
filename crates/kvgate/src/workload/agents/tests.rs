//! Tests of the agents workload shape and its validation.

use super::*;

#[test]
fn default_contexts_grow_every_turn() {
    let spec = AgentsSpec::default();
    assert!(spec.validate().is_ok());
    assert!(spec.prompt_tokens(1) > spec.prompt_tokens(0));
    assert_eq!(spec.prompt_tokens(0), u64::from(spec.first_prompt_tokens));
}

#[test]
fn new_input_is_deterministic_and_distinct_per_agent() {
    let spec = AgentsSpec::default();
    assert_eq!(spec.new_input(3, 2), spec.new_input(3, 2));
    assert_ne!(spec.new_input(3, 2), spec.new_input(4, 2));
    assert_ne!(spec.new_input(3, 2), spec.new_input(3, 3));
    assert_eq!(
        spec.new_input(0, 0).len(),
        spec.first_prompt_tokens as usize
    );
    assert_eq!(spec.new_input(0, 1).len(), spec.turn_input_tokens as usize);
}

#[test]
fn zero_counts_are_rejected_by_name() {
    let spec = AgentsSpec {
        turns: 0,
        ..AgentsSpec::default()
    };
    assert_eq!(
        spec.validate(),
        Err(AgentsSpecError::Zero { field: "turns" })
    );
    assert_eq!(
        AgentsSpecError::Zero { field: "turns" }.to_string(),
        "agents: `turns` must be at least 1, got 0"
    );
}

#[test]
fn bad_think_time_is_rejected() {
    let spec = AgentsSpec {
        think_s: -1.0,
        ..AgentsSpec::default()
    };
    assert_eq!(
        spec.validate(),
        Err(AgentsSpecError::ThinkTime { value: "-1".into() })
    );
    let spec = AgentsSpec {
        think_s: f64::NAN,
        ..AgentsSpec::default()
    };
    assert!(matches!(
        spec.validate(),
        Err(AgentsSpecError::ThinkTime { .. })
    ));
}

#[test]
fn max_from_cache_counts_everything_but_new_input() {
    let spec = AgentsSpec {
        n_agents: 2,
        turns: 2,
        first_prompt_tokens: 100,
        turn_input_tokens: 10,
        response_tokens: 40,
        ..AgentsSpec::default()
    };
    // per agent: turn 0 = 100, turn 1 = 150 (of which 140 seen before)
    assert_eq!(spec.total_prompt_tokens(), 500);
    assert!((spec.max_from_cache_pct() - 56.0).abs() < 1e-9);
}
