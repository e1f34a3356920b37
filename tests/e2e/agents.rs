//! A small deterministic agents run under every policy, as a snapshot, plus the properties the headline
//! comparison rests on: `reserved` restores every later turn and leaks nothing, and the policies without the
//! contract lose because of their mechanism.

use engine::Policy;
use kvgate::EngineConfig;
use kvgate::workload::agents::AgentsSpec;
use kvgate::{report, run};

use crate::without_wall_time;

fn small() -> (EngineConfig, AgentsSpec) {
    let mut config = crate::verified_config();
    config.pool.pages = 256;
    let spec = AgentsSpec {
        n_agents: 4,
        turns: 4,
        first_prompt_tokens: 1024,
        turn_input_tokens: 512,
        response_tokens: 32,
        think_s: 1.0,
        seed: 7,
        ..AgentsSpec::default()
    };
    (config, spec)
}

#[test]
fn small_agents_run_matches_its_snapshot() {
    let (config, spec) = small();
    let runs: Vec<_> = Policy::ALL
        .iter()
        .map(|&policy| run::run_agents(&config, &spec, policy, &mut |_, _| {}).unwrap())
        .collect();
    let [ordinary, pages_only, reserved, oracle] = &runs[..] else {
        unreachable!("four policies")
    };
    for run in &runs {
        assert_eq!(run.leaked_pages, 0, "{}", run.policy);
    }
    assert_eq!(
        reserved.later_turns_restored + reserved.later_turns_local_hit,
        reserved.later_turns,
        "reserved serves every later turn from cache"
    );
    assert!(reserved.prompt_tokens_from_cache_pct >= ordinary.prompt_tokens_from_cache_pct);
    assert!(reserved.prompt_tokens_from_cache_pct >= pages_only.prompt_tokens_from_cache_pct);
    assert!(oracle.prompt_tokens_from_cache_pct >= reserved.prompt_tokens_from_cache_pct);
    insta::with_settings!({ snapshot_path => crate::repo_root().join("tests/snapshots"), prepend_module_to_snapshot => false }, {
        insta::assert_json_snapshot!("agents_small", without_wall_time(report::runs_json(&runs, &[])));
    });
}
