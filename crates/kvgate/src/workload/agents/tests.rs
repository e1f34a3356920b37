//! Tests of the agents workload shape and its validation.

use super::*;

#[test]
fn default_contexts_grow_every_turn() {
    let spec = AgentsSpec::default();
    assert!(spec.validate().is_ok());
    for turn in 1..spec.turns {
        assert!(spec.prompt_tokens(3, turn) > spec.prompt_tokens(3, turn - 1));
    }
    assert_eq!(
        spec.prompt_tokens(3, 0),
        u64::from(spec.first_prompt_tokens)
    );
}

#[test]
fn lengths_and_think_times_vary_around_their_means_and_follow_the_seed() {
    let spec = AgentsSpec::default();
    let inputs: Vec<u32> = (1..spec.turns)
        .map(|turn| spec.input_len(0, turn))
        .collect();
    assert!(
        inputs
            .iter()
            .all(|&n| n >= spec.turn_input_tokens / 2 && n <= spec.turn_input_tokens * 3 / 2)
    );
    assert!(inputs.iter().any(|&n| n != inputs[0]), "lengths vary");
    let responses: Vec<u32> = (0..spec.turns)
        .map(|turn| spec.response_len(1, turn))
        .collect();
    assert!(
        responses
            .iter()
            .all(|&n| n >= spec.response_tokens / 2 && n <= spec.response_tokens * 3 / 2)
    );
    let think = spec.think_s(2, 3);
    assert!(think >= spec.think_s * 0.5 && think < spec.think_s * 1.5);
    let other = AgentsSpec {
        seed: spec.seed + 1,
        ..spec.clone()
    };
    assert_ne!(
        (1..spec.turns)
            .map(|turn| other.input_len(0, turn))
            .collect::<Vec<_>>(),
        inputs,
        "another seed, another workload"
    );
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
    assert_eq!(spec.new_input(0, 1).len(), spec.input_len(0, 1) as usize);
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
        "agents: `turns` (--turns) must be at least 1, got 0"
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
        ..AgentsSpec::default()
    };
    let (mut total, mut new) = (0, 0);
    for agent in 0..2 {
        let turn_1 = 100 + spec.response_len(agent, 0) + spec.input_len(agent, 1);
        assert_eq!(spec.prompt_tokens(agent, 1), u64::from(turn_1));
        total += 100 + turn_1;
        new += 100 + spec.input_len(agent, 1);
    }
    assert_eq!(spec.total_prompt_tokens(), u64::from(total));
    let expected = 100.0 * f64::from(total - new) / f64::from(total);
    assert!((spec.max_from_cache_pct() - expected).abs() < 1e-9);
}

#[test]
fn counts_and_times_above_their_limits_are_refused_naming_the_field_and_the_limit() {
    let error = |spec: AgentsSpec| spec.validate().unwrap_err().to_string();
    let spec = AgentsSpec::default();
    assert_eq!(
        error(AgentsSpec {
            n_agents: u32::MAX,
            ..spec.clone()
        }),
        "agents: `n_agents` (--agents) = 4294967295 is above the limit of 100000; run fewer sessions"
    );
    assert_eq!(
        error(AgentsSpec {
            n_agents: 100_001,
            turns: 1,
            ..spec.clone()
        }),
        "agents: `n_agents` (--agents) = 100001 is above the limit of 100000; run fewer sessions"
    );
    assert_eq!(
        error(AgentsSpec {
            n_agents: 1,
            turns: u32::MAX,
            ..spec.clone()
        }),
        "agents: `n_agents * turns` (--agents times --turns) = 4294967295 is above the limit of 100000; run fewer sessions or turns"
    );
    assert_eq!(
        error(AgentsSpec {
            first_prompt_tokens: u32::MAX,
            ..spec.clone()
        }),
        "agents: `first_prompt_tokens` = 4294967295 is above the limit of 16777216; no model is that long"
    );
    for think_s in [1e300, 5e8 * 1.01, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            error(AgentsSpec {
                think_s,
                ..spec.clone()
            }),
            format!(
                "agents: `think_s` (--think-s) must be a number of seconds from 0 to 5e8, got {}",
                crate::limits::show(think_s)
            )
        );
    }
    AgentsSpec {
        n_agents: crate::limits::AGENTS_MAX,
        turns: 1,
        think_s: THINK_S_MAX,
        ..spec
    }
    .validate()
    .unwrap();
}

#[test]
fn total_prompt_tokens_sums_every_turns_prompt() {
    let spec = AgentsSpec::default();
    let by_turn: u64 = (0..spec.n_agents)
        .flat_map(|agent| (0..spec.turns).map(move |turn| (agent, turn)))
        .map(|(agent, turn)| spec.prompt_tokens(agent, turn))
        .sum();
    assert_eq!(spec.total_prompt_tokens(), by_turn);
}

#[test]
fn a_turn_asks_for_its_index_by_progress_and_for_nothing_by_arrival() {
    for turn in [0, 1, 31, u32::MAX] {
        assert_eq!(TurnPriority::Arrival.of(turn), 0);
    }
    assert_eq!(TurnPriority::Progress.of(0), 0);
    assert_eq!(TurnPriority::Progress.of(31), 31);
    // Beyond i32 (never a real turn: the limits stop at 100,000 turns in all) it saturates.
    assert_eq!(TurnPriority::Progress.of(u32::MAX), i32::MAX);
    assert_eq!(AgentsSpec::default().turn_priority, TurnPriority::Arrival);
}
