//! A closed-loop agents driver (sessions whose every turn appends new input to the previous prompt and
//! response), the E1 rotation test and the side-by-side comparison of the policies.

use std::time::Duration;

use engine::{Engine, EngineParams, Policy, RequestSpec, RunMetrics};
use kv_pool::Timestamp;

/// Shape of an agents run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agents {
    pub(crate) n_agents: u32,
    pub(crate) turns: u32,
    pub(crate) first_prompt_tokens: u32,
    pub(crate) turn_input_tokens: u32,
    pub(crate) response_tokens: u32,
    pub(crate) think_s: f64,
    pub(crate) seed: u64,
}

/// Deterministic token stream: splitmix64 of (seed, agent, turn, index).
pub(crate) fn tokens(seed: u64, agent: u32, turn: u32, n: u32) -> Vec<u32> {
    (0..n)
        .map(|index| {
            let mut x =
                seed ^ (u64::from(agent) << 40) ^ (u64::from(turn) << 20) ^ u64::from(index);
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((x ^ (x >> 31)) % 50_000) as u32
        })
        .collect()
}

/// What a run produced: metrics and the order requests finished in, per agent.
#[derive(Debug)]
pub(crate) struct AgentsRun {
    pub(crate) metrics: RunMetrics,
    pub(crate) steps: u64,
    pub(crate) pages_verified: u64,
}

/// Runs the workload to completion under `params`, checking invariants every `check_every` steps.
pub(crate) fn run_agents(params: EngineParams, agents: Agents, check_every: u64) -> AgentsRun {
    run_agents_on(
        Engine::new(params).expect("valid params"),
        agents,
        check_every,
    )
}

/// `run_agents` on `engine`, built with the parts its caller gave it.
pub(crate) fn run_agents_on(mut engine: Engine, agents: Agents, check_every: u64) -> AgentsRun {
    let mut contexts: Vec<Vec<u32>> = Vec::new();
    for agent in 0..agents.n_agents {
        let prompt = tokens(agents.seed, agent, 0, agents.first_prompt_tokens);
        let arrival = Timestamp(Duration::from_secs_f64(f64::from(agent) * 0.5));
        let spec = turn_spec(agent, 0, prompt.clone(), agents, arrival);
        engine.submit(spec).expect("submit");
        contexts.push(prompt);
    }
    let mut steps = 0u64;
    while !engine.is_idle() {
        let report = engine.step().expect("step");
        steps += 1;
        if check_every > 0 && steps.is_multiple_of(check_every) {
            engine.check_invariants().expect("invariants");
        }
        assert!(
            !report.idle || engine.is_idle(),
            "engine stalled at step {steps}"
        );
        assert!(steps < 5_000_000, "run did not finish");
        for finished in engine.take_finished() {
            assert!(!finished.cancelled);
            let agent = (finished.id.0 >> 16) as u32;
            let turn = (finished.id.0 & 0xffff) as u32;
            let context = &mut contexts[agent as usize];
            context.extend_from_slice(&finished.output);
            if turn + 1 < agents.turns {
                context.extend(tokens(
                    agents.seed,
                    agent,
                    turn + 1,
                    agents.turn_input_tokens,
                ));
                let arrival = engine.now().after(Duration::from_secs_f64(agents.think_s));
                let spec = turn_spec(agent, turn + 1, context.clone(), agents, arrival);
                engine.submit(spec).expect("submit next turn");
            }
        }
    }
    engine.check_invariants().expect("invariants");
    AgentsRun {
        metrics: engine.metrics(),
        steps,
        pages_verified: engine.pages_verified(),
    }
}

fn turn_spec(
    agent: u32,
    turn: u32,
    prompt: Vec<u32>,
    agents: Agents,
    arrival: Timestamp,
) -> RequestSpec {
    let mut spec = RequestSpec::new(
        (u64::from(agent) << 16) | u64::from(turn),
        prompt,
        agents.response_tokens,
        arrival,
    );
    spec.salt = b"tenant".to_vec();
    spec.is_later_turn = turn > 0;
    spec
}

/// The comparison workload: contexts outgrow the pool several times over by the later turns.
pub(crate) fn comparison_workload() -> (EngineParams, Agents) {
    let agents = Agents {
        n_agents: 8,
        turns: 32,
        first_prompt_tokens: 384,
        turn_input_tokens: 24,
        response_tokens: 128,
        think_s: 1.0,
        seed: 7,
    };
    let params = EngineParams {
        n_pages: 512,
        max_running: 16,
        ..crate::verified_defaults()
    };
    (params, agents)
}

/// One table row: a metric's name and how to print it.
type Row = (&'static str, fn(&RunMetrics) -> String);

#[test]
#[allow(
    clippy::print_stderr,
    reason = "the comparison table is the point of this test"
)]
fn agents_policies_side_by_side() {
    let (params, agents) = comparison_workload();
    let mut runs = Vec::new();
    for policy in Policy::ALL {
        let run = run_agents(
            EngineParams {
                policy,
                ..params.clone()
            },
            agents,
            0,
        );
        runs.push(run);
    }
    eprintln!(
        "{:<32}{:>14}{:>14}{:>14}{:>14}",
        "metric", "ordinary", "pages-only", "reserved", "oracle"
    );
    let rows: [Row; 15] = [
        ("prompt_tokens_from_cache_pct", |m| {
            format!("{:.1}", m.prompt_tokens_from_cache_pct)
        }),
        ("later_turns_restored", |m| {
            format!("{}/{}", m.later_turns_restored, m.later_turns)
        }),
        ("later_turns_local_hit", |m| {
            m.later_turns_local_hit.to_string()
        }),
        ("prompt_tokens", |m| m.prompt_tokens.to_string()),
        ("prompt_tokens_local_hit", |m| {
            m.prompt_tokens_local_hit.to_string()
        }),
        ("prompt_tokens_restored", |m| {
            m.prompt_tokens_restored.to_string()
        }),
        ("prompt_tokens_recomputed", |m| {
            m.prompt_tokens_recomputed.to_string()
        }),
        ("mean_turn_s", |m| format!("{:.2}", m.mean_turn_s)),
        ("p50_ttft_s", |m| format!("{:.3}", m.p50_ttft_s)),
        ("p99_ttft_s", |m| format!("{:.3}", m.p99_ttft_s)),
        ("aggregate_decode_tok_s", |m| {
            format!("{:.1}", m.aggregate_decode_tok_s)
        }),
        ("capacity_waits", |m| m.capacity_waits.to_string()),
        ("longest_capacity_wait_s", |m| {
            format!("{:.2}", m.longest_capacity_wait_s)
        }),
        ("preemptions", |m| m.preemptions.to_string()),
        ("leaked_pages", |m| m.leaked_pages.to_string()),
    ];
    for (name, value) in rows {
        eprint!("{name:<32}");
        for run in &runs {
            eprint!("{:>14}", value(&run.metrics));
        }
        eprintln!();
    }
    for run in &runs {
        eprintln!(
            "{}: fallbacks {:?}, sim {:.1} s, wall {:.2} s, steps {}",
            run.metrics.policy,
            run.metrics.restore_fallbacks,
            run.metrics.sim_seconds,
            run.metrics.wall_seconds,
            run.steps
        );
    }
    let reserved = &runs[2].metrics;
    assert!(
        reserved.prompt_tokens_from_cache_pct >= 98.0,
        "reserved served {:.1}%",
        reserved.prompt_tokens_from_cache_pct
    );
    assert_eq!(
        reserved.later_turns_restored + reserved.later_turns_local_hit,
        reserved.later_turns
    );
    for run in &runs {
        assert_eq!(run.metrics.leaked_pages, 0, "{} leaked", run.metrics.policy);
    }
}

#[test]
fn same_seed_and_config_give_an_identical_run() {
    let agents = Agents {
        n_agents: 4,
        turns: 4,
        first_prompt_tokens: 300,
        turn_input_tokens: 20,
        response_tokens: 30,
        think_s: 0.5,
        seed: 11,
    };
    for policy in Policy::ALL {
        let params = EngineParams {
            policy,
            n_pages: 64,
            ..crate::verified_defaults()
        };
        let mut first = run_agents(params.clone(), agents, 7).metrics;
        let mut second = run_agents(params, agents, 7).metrics;
        first.wall_seconds = 0.0;
        second.wall_seconds = 0.0;
        assert_eq!(first, second, "{policy}");
    }
}

/// G3 under load (issue 27, item 1): agents sessions with a checkpoint store far smaller than their contexts,
/// so captures evict checkpoints while restores that looked them up wait for capacity. Some restores find
/// their checkpoint gone only after their reservation (the precondition, asserted): each releases its ticket,
/// whose pages come back at once; no error is logged, and every invariant holds after every step. `KVGATE_SIM_SEEDS=N` runs seeds `0..N / 3` (4 by default).
#[test]
fn g3_a_small_store_evicting_checkpoints_under_load_never_strands_a_tickets_pages() {
    let n_seeds = std::env::var("KVGATE_SIM_SEEDS")
        .ok()
        .and_then(|value| value.parse::<u64>().ok())
        .map_or(4, |n| (n / 3).max(1));
    let (params, agents) = comparison_workload();
    let mut lost = 0;
    for seed in 0..n_seeds {
        let params = EngineParams {
            policy: Policy::Reserved,
            store_capacity_pages: 400,
            seed,
            ..params.clone()
        };
        let agents = Agents { seed, ..agents };
        let logs = crate::restart::captured_logs(|| {
            let run = run_agents(params, agents, 1);
            assert_eq!(run.metrics.leaked_pages, 0, "seed {seed}");
        });
        assert!(!logs.contains("ERROR"), "seed {seed}: {logs}");
        lost += logs
            .matches("checkpoint lost after its reservation")
            .count();
    }
    assert!(lost > 0, "no checkpoint was lost after its reservation");
}
