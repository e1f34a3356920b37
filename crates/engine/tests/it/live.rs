//! The reference executor in the step loop (L3-L5): real KV and recurrent state through the page tables,
//! greedy tokens, restore == recompute bit for bit, the same tokens after a restore as after a recompute
//! under every policy, a corrupted copy caught by verification, and the wall clock (L1).

use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{
    Clock, ClockKind, CopyEngineKind, Engine, EngineParams, Error, Executor, Policy,
    ReferenceExecutor, RequestSpec, SimClock, WallClock,
};
use kv_pool::{CacheGroup, Geometry, GroupKind, HostStorage, PageId, RequestId, Timestamp};
use reference_model::{ForwardEntry, ModelError, ModelStorage, ReferenceConfig};

use crate::agents::tokens;
use crate::contract::spec;

/// The tiny reference model, with or without its recurrent layer.
fn config(recurrent: bool) -> ReferenceConfig {
    ReferenceConfig {
        n_recurrent_layers: u32::from(recurrent),
        seed: 11,
        ..ReferenceConfig::tiny()
    }
}

/// `policy` on the model's own geometry, small chunks, verifying every restore (E3, L5) whatever the build.
fn ref_params(policy: Policy, config: &ReferenceConfig, n_pages: u32) -> EngineParams {
    EngineParams {
        geometry: Geometry::new(config.cache_groups(), config.tokens_per_page, 1, 4096)
            .expect("the model's geometry is valid"),
        policy,
        n_pages,
        max_running: 4,
        chunk_tokens: 48,
        max_batched_tokens: 96,
        verify_restores: true,
        ..crate::verified_defaults()
    }
}

fn ref_engine(policy: Policy, recurrent: bool) -> Engine<ReferenceExecutor> {
    let config = config(recurrent);
    let executor = ReferenceExecutor::new(config).expect("the tiny model builds");
    Engine::builder(ref_params(policy, &config, 257))
        .executor(executor)
        .build()
        .expect("the engine builds")
}

/// Steps `engine` until idle, checking the invariants after every step; the outputs of what finished.
pub(crate) fn run<E: Executor>(engine: &mut Engine<E>) -> Vec<(RequestId, Vec<u32>)> {
    try_run(engine).expect("the run")
}

/// `run`, returning a failed step or invariant check as its error instead of panicking on it.
pub(crate) fn try_run<E: Executor>(
    engine: &mut Engine<E>,
) -> Result<Vec<(RequestId, Vec<u32>)>, engine::Error> {
    for _ in 0..100_000 {
        if engine.is_idle() {
            break;
        }
        let _report = engine.step()?;
        engine.check_invariants()?;
    }
    assert!(engine.is_idle(), "the run ends");
    let mut outputs: Vec<_> = engine
        .take_finished()
        .into_iter()
        .map(|done| (done.id, done.output))
        .collect();
    outputs.sort();
    Ok(outputs)
}

/// Greedy decoding of `prompt` by the model alone, in one contiguous page table: `n` tokens.
fn greedy_alone(config: ReferenceConfig, prompt: &[u32], n: u32) -> Vec<u32> {
    let model = reference_model::ReferenceModel::new(config).unwrap();
    let attention = HostStorage::new(1, 512, config.bytes_per_page()).unwrap();
    let recurrent = (config.n_recurrent_layers > 0)
        .then(|| HostStorage::new(1, 2, config.recurrent_bytes_per_page()).unwrap());
    let storage = ModelStorage {
        attention: &attention,
        local: None,
        recurrent: recurrent.as_ref().map(|r| r as &dyn kv_pool::PageStorage),
    };
    let table: Vec<PageId> = (1..512).map(PageId).collect();
    let mut input: Vec<u32> = prompt.iter().map(|t| t % config.vocab).collect();
    let mut first_pos = 0u32;
    let mut output = Vec::new();
    while output.len() < n as usize {
        let entry = ForwardEntry {
            tokens: &input,
            first_pos,
            attention_pages: &table,
            local_pages: &[],
            state_pages: if recurrent.is_some() {
                &[PageId(1)]
            } else {
                &[]
            },
            want_logits: true,
        };
        let logits = model.forward(storage, &[entry]).unwrap();
        let next = logits[0].as_ref().unwrap().next_token;
        first_pos += input.len() as u32;
        output.push(next);
        input = vec![next];
    }
    output
}

#[test]
fn l3_reference_executor_decodes_through_page_tables_as_the_model_alone() {
    for recurrent in [false, true] {
        let config = config(recurrent);
        let mut engine = ref_engine(Policy::Reserved, recurrent);
        // Three requests interleaved in chunks: their pages are scattered over the pool.
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|agent| tokens(3, agent, 0, 70 + 25 * agent))
            .collect();
        for (id, prompt) in prompts.iter().enumerate() {
            engine
                .submit(spec(id as u64, prompt.clone(), 6, engine.now()))
                .unwrap();
        }
        let outputs = run(&mut engine);
        assert_eq!(outputs.len(), 3);
        for (id, output) in outputs {
            let expected = greedy_alone(config, &prompts[id.0 as usize], 6);
            assert_eq!(output, expected, "{id} (recurrent {recurrent})");
            assert!(output.iter().all(|&token| token < config.vocab));
        }
        assert_eq!(engine.executor().name(), "reference");
        assert!(engine.executor().steps() > 0);
    }
}

/// Turn 1 of a session, then (after a prefix-cache reset, so only the store can serve it) turn 2 restored
/// from turn 1's checkpoint with every page verified against a recompute; the same turn 2 on a fresh engine
/// recomputes it all. Returns (restored tokens, pages verified, turn 2's output restored, recomputed).
fn restore_and_recompute(policy: Policy, recurrent: bool) -> (u32, u64, Vec<u32>, Vec<u32>) {
    let mut engine = ref_engine(policy, recurrent);
    let prompt = tokens(5, 0, 0, 150);
    engine
        .submit(spec(1, prompt.clone(), 5, engine.now()))
        .unwrap();
    let first = run(&mut engine);
    engine.reset_prefix_cache().unwrap();
    let turn2 = [prompt, first[0].1.clone(), tokens(5, 0, 1, 20)].concat();
    let mut later = spec(2, turn2.clone(), 8, engine.now());
    later.is_later_turn = true;
    engine.submit(later.clone()).unwrap();
    let restored = run(&mut engine);
    let restored_tokens = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(2)))
        .unwrap()
        .prompt_tokens_restored;
    let mut fresh = ref_engine(policy, recurrent);
    fresh
        .submit(RequestSpec {
            arrival: fresh.now(),
            ..later
        })
        .unwrap();
    let recomputed = run(&mut fresh);
    (
        restored_tokens,
        engine.pages_verified(),
        restored[0].1.clone(),
        recomputed[0].1.clone(),
    )
}

#[test]
fn l4_restored_kv_and_state_equal_recompute_and_generate_the_same_tokens_under_every_policy() {
    for policy in Policy::ALL {
        for recurrent in [false, true] {
            let (restored_tokens, verified, after_restore, after_recompute) =
                restore_and_recompute(policy, recurrent);
            let case = format!("{} (recurrent {recurrent})", policy.name());
            assert!(
                restored_tokens >= 144,
                "{case}: restored {restored_tokens} tokens"
            );
            // Every restored page (the recurrent state page included) matched a recompute byte for byte.
            assert!(verified >= 9, "{case}: {verified} pages verified");
            assert_eq!(
                after_restore, after_recompute,
                "{case}: model-output equivalence"
            );
        }
    }
}

#[test]
fn l5_a_corrupted_copy_is_caught_by_the_reference_executors_verification() {
    for recurrent in [false, true] {
        let mut engine = ref_engine(Policy::Reserved, recurrent);
        assert!(engine.params().verify_restores);
        let prompt = tokens(9, 0, 0, 120);
        engine
            .submit(spec(1, prompt.clone(), 3, engine.now()))
            .unwrap();
        let first = run(&mut engine);
        engine.reset_prefix_cache().unwrap();
        engine
            .inject_copy_fault(Fault::CorruptNext { rank: 0, byte: 7 })
            .unwrap();
        let mut later = spec(
            2,
            [prompt, first[0].1.clone(), vec![1, 2, 3]].concat(),
            2,
            engine.now(),
        );
        later.is_later_turn = true;
        engine.submit(later).unwrap();
        let error = crate::first_error(&mut engine, "the corruption");
        match error {
            Error::RestoreMismatch {
                request,
                block,
                byte,
                ..
            } => {
                assert_eq!((request, block, byte), (RequestId(2), 0, 7));
                assert!(
                    error
                        .to_string()
                        .contains("differs from recompute at byte 7")
                );
            }
            other => panic!("expected a restore mismatch, got {other}"),
        }
    }
}

#[test]
fn l3_reference_executor_refuses_other_geometries_and_saved_logits() {
    let config = config(true);
    let build = |params: EngineParams| {
        Engine::builder(params)
            .executor(ReferenceExecutor::new(config).unwrap())
            .build()
            .map(|_| ())
    };
    let base = ref_params(Policy::Reserved, &config, 65);
    let full_only = Geometry::new(self::config(false).cache_groups(), 16, 1, 4096).unwrap();
    let wrong_page = Geometry::new(config.cache_groups(), 32, 1, 4096).unwrap();
    let two_ranks = Geometry::new(config.cache_groups(), 16, 2, 4096).unwrap();
    let mut with_aux = config.cache_groups();
    with_aux.push(CacheGroup {
        kind: GroupKind::Auxiliary { pages: 1 },
        bytes_per_page: 64,
    });
    let with_aux = Geometry::new(with_aux, 16, 1, 4096).unwrap();
    for (geometry, expect) in [
        (full_only, "cache groups"),
        (
            wrong_page,
            "32 tokens per page, but the model's pages hold 16",
        ),
        (two_ranks, "2 context-parallel ranks"),
        (with_aux, "cache groups"),
    ] {
        let error = build(EngineParams {
            geometry,
            ..base.clone()
        })
        .unwrap_err();
        assert!(
            matches!(error, Error::UnsupportedGeometry { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(expect), "{error}");
    }
    // Draft decoding runs: the model proposes no draft token, the engine budgets the lookahead slots.
    build(EngineParams {
        draft_tokens: 3,
        ..base.clone()
    })
    .expect("draft tokens are accepted");
    let invalid = ReferenceExecutor::new(ReferenceConfig {
        head_dim: 3,
        ..config
    })
    .unwrap_err();
    // The model's own error, boxed, is the engine error's source, and its message follows the prefix.
    let Error::Model(model) = &invalid else {
        panic!("not a model error: {invalid}");
    };
    assert!(
        matches!(
            model.downcast_ref::<ModelError>(),
            Some(ModelError::InvalidConfig {
                name: "head_dim",
                ..
            })
        ),
        "{model}"
    );
    assert!(
        std::error::Error::source(&invalid).is_some_and(|source| source.is::<ModelError>()),
        "{invalid}"
    );
    assert_eq!(invalid.to_string(), format!("reference executor: {model}"));
    let mut engine = ref_engine(Policy::Reserved, true);
    let mut with_logits = spec(1, vec![1, 2, 3], 1, engine.now());
    with_logits.saved_logits = true;
    let error = engine.submit(with_logits).unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidParam {
                name: "saved_logits",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn l1_the_same_step_loop_runs_on_the_wall_clock_with_threaded_copies_and_real_compute() {
    for policy in Policy::ALL {
        let config = config(true);
        let params = EngineParams {
            clock: ClockKind::Wall,
            copy_engine: CopyEngineKind::Threaded { workers: 2 },
            ..ref_params(policy, &config, 257)
        };
        let mut engine = Engine::builder(params)
            .executor(ReferenceExecutor::new(config).unwrap())
            .build()
            .unwrap();
        assert_eq!(engine.clock_name(), "wall");
        let prompt = tokens(13, 0, 0, 100);
        engine
            .submit(spec(1, prompt.clone(), 4, engine.now()))
            .unwrap();
        let first = run(&mut engine);
        engine.reset_prefix_cache().unwrap();
        // Turn 2 arrives 30 ms of wall time later: the engine waits for it instead of jumping.
        let think = Duration::from_millis(30);
        let submitted = engine.now();
        let turn2 = [prompt, first[0].1.clone(), tokens(13, 0, 1, 10)].concat();
        let mut later = spec(2, turn2.clone(), 4, submitted.after(think));
        later.is_later_turn = true;
        engine.submit(later.clone()).unwrap();
        let restored = run(&mut engine);
        let metrics = engine.metrics();
        assert_eq!(metrics.later_turns_restored, 1, "{}", policy.name());
        let turn = engine
            .request_metrics()
            .iter()
            .find(|m| m.id == Some(RequestId(2)))
            .unwrap()
            .clone();
        assert!(turn.first_token.unwrap().since(submitted) >= think);
        assert!(engine.pages_verified() > 0);
        // The tokens equal a recompute's on the simulated clock.
        let mut fresh = ref_engine(policy, true);
        fresh
            .submit(RequestSpec {
                arrival: fresh.now(),
                ..later
            })
            .unwrap();
        assert_eq!(run(&mut fresh)[0].1, restored[0].1, "{}", policy.name());
        let _report = engine.shutdown().unwrap();
    }
}

#[test]
fn l1_the_simulated_clock_jumps_and_the_wall_clock_waits() {
    let start = Timestamp::ZERO;
    let later = start.after(Duration::from_secs(5));
    let mut sim = SimClock;
    assert_eq!(sim.idle_until(start, later), later);
    assert_eq!(
        sim.after_step(start, Duration::ZERO),
        start.after(Duration::from_nanos(1))
    );
    let mut wall = WallClock::new();
    let now = wall.step_start(start);
    let after_idle = wall.idle_until(now, later);
    // It waited, but never past its poll interval towards an event seconds away.
    assert!(after_idle > now && after_idle < later);
    assert!(wall.after_step(after_idle, Duration::from_secs(60)) < later);
}

/// E2 with a model's own stop token (`EngineParams::stop_token`): the answer ends at the first sampled stop
/// token, as an early stop does, and leaves its response checkpoint, which the next turn restores. Without
/// the parameter the same model runs to its cap.
#[test]
fn e2_an_answer_ends_at_the_models_stop_token_and_leaves_its_response_checkpoint() {
    let config = config(false);
    let prompt = tokens(5, 0, 0, 3 * config.tokens_per_page + 5);
    let cap = 2 * config.tokens_per_page;
    let mut free = ref_engine(Policy::Reserved, false);
    free.submit(spec(1, prompt.clone(), cap, free.now()))
        .unwrap();
    let (_, full) = run(&mut free).pop().unwrap();
    assert_eq!(full.len(), cap as usize, "no stop token: the cap ends it");
    // A token the model samples after a few others, at its first occurrence.
    let at = (3..full.len())
        .find(|&i| !full[..i].contains(&full[i]))
        .expect("the model samples a new token after its third");
    let stop = full[at];

    let executor = ReferenceExecutor::new(config).unwrap();
    let params = EngineParams {
        stop_token: Some(stop),
        ..ref_params(Policy::Reserved, &config, 257)
    };
    let mut engine = Engine::builder(params).executor(executor).build().unwrap();
    engine
        .submit(spec(1, prompt.clone(), cap, engine.now()))
        .unwrap();
    let (_, output) = run(&mut engine).pop().unwrap();
    assert_eq!(
        output,
        full[..=at],
        "the answer ends at the stop token, which it keeps"
    );
    let metrics = engine.request_metrics()[0].clone();
    assert!(!metrics.cancelled, "ended, not cancelled");

    // The next turn: its prefix through the response is restored from the response checkpoint.
    engine.reset_prefix_cache().unwrap();
    let next = [prompt, output, vec![9; 20]].concat();
    let response_blocks = (next.len() as u32 - 20 - 1) / config.tokens_per_page;
    engine.submit(spec(2, next, 2, engine.now())).unwrap();
    let _ = run(&mut engine);
    assert_eq!(
        crate::contract::metrics_of(&engine, 2).prompt_tokens_restored,
        response_blocks * config.tokens_per_page,
        "the response checkpoint covers the answer through its stop token"
    );
}
