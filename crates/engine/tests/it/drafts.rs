//! Draft decoding's outcome (issue 32, part 3; H5, H7): a decode step yields between 1 and `1 + draft_tokens`
//! tokens, the drafts it accepts drawn per request and position (`EngineParams::draft_acceptance`), so that
//! no batch changes a request's outcome; the answer never passes its cap or its stop; only accepted positions
//! count as computed; and a later turn restores the response checkpoint at its exact boundary.

use std::collections::BTreeMap;

use engine::{Engine, EngineParams, Policy, STOP_TOKEN};
use kv_pool::RequestId;

use crate::agents::tokens;
use crate::contract::{metrics_of, spec};
use crate::hybrid::{geometry_params, hybrid_groups};

/// One full-attention group, `draft_tokens` drafts accepted with probability `acceptance`, room for all.
fn drafting(draft_tokens: u32, acceptance: f64) -> EngineParams {
    EngineParams {
        draft_tokens,
        draft_acceptance: acceptance,
        n_pages: 1024,
        max_running: 8,
        seed: 7,
        ..crate::verified_defaults()
    }
}

/// What one decoding request did, step by step: the tokens each decode step yielded.
type Yields = BTreeMap<u64, Vec<u32>>;

/// Steps `engine` until idle, checking after every decode step that it yielded 1 to `1 + depth` tokens and
/// that exactly the pending token and the accepted drafts were computed (a rejected draft's position is not:
/// every token but the last output is computed). Returns each request's yields and outputs.
fn run_checked(engine: &mut Engine, depth: u32) -> (Yields, BTreeMap<u64, Vec<u32>>) {
    let mut yields = Yields::new();
    let mut outputs = BTreeMap::new();
    let mut prompts: BTreeMap<u64, u32> = BTreeMap::new();
    for _ in 0..100_000 {
        if engine.is_idle() {
            break;
        }
        let before: BTreeMap<u64, (u32, u32)> = (0..64)
            .filter_map(|id| {
                let view = engine.request(RequestId(id))?;
                Some((id, (view.n_output, view.n_computed)))
            })
            .collect();
        let report = engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        let finished: BTreeMap<u64, Vec<u32>> = engine
            .take_finished()
            .into_iter()
            .map(|finished| (finished.id.0, finished.output))
            .collect();
        for id in &report.decodes {
            let (out_before, computed_before) = before[&id.0];
            let view = engine.request(*id);
            let n_output = match (&view, finished.get(&id.0)) {
                (Some(view), _) => view.n_output,
                (None, Some(output)) => output.len() as u32,
                (None, None) => panic!("{id} decoded, then neither runs nor finished"),
            };
            let yielded = n_output - out_before;
            assert!(
                (1..=1 + depth).contains(&yielded),
                "{id}: a decode step yielded {yielded} tokens"
            );
            yields.entry(id.0).or_default().push(yielded);
            let Some(view) = view else {
                continue;
            };
            assert_eq!(
                view.n_computed,
                computed_before + yielded,
                "{id}: the pending token and the accepted drafts are computed, nothing more"
            );
            let prompt = *prompts
                .entry(id.0)
                .or_insert(computed_before + 1 - out_before);
            assert_eq!(
                view.n_computed,
                prompt + view.n_output - 1,
                "{id}: only the last token is pending"
            );
        }
        outputs.extend(finished);
    }
    assert!(engine.is_idle(), "the run ended");
    (yields, outputs)
}

#[test]
fn h5_a_decode_step_yields_one_to_one_plus_depth_tokens_and_computes_only_accepted_positions() {
    let mut engine = Engine::new(drafting(3, 0.85)).expect("runs");
    for id in 0..6 {
        let request = spec(
            id,
            tokens(60, id as u32, 0, 90 + 13 * id as u32),
            150,
            engine.now(),
        );
        engine.submit(request).unwrap();
    }
    let (yields, outputs) = run_checked(&mut engine, 3);
    let all: Vec<u32> = yields.values().flatten().copied().collect();
    let mean = f64::from(all.iter().sum::<u32>()) / all.len() as f64;
    // (1 - 0.85^4) / (1 - 0.85) = 3.19 tokens a step on average; some steps reject their first draft, some
    // accept all three.
    assert!(
        (2.9..=3.5).contains(&mean),
        "mean tokens a decode step {mean}"
    );
    assert!(all.contains(&1) && all.contains(&4), "{all:?}");
    for (id, output) in &outputs {
        assert_eq!(output.len(), 150, "{id}: the cap, exactly");
        assert_eq!(metrics_of(&engine, *id).decode_tokens, 150);
    }
    assert_eq!(engine.leaked_pages(), 0);
}

#[test]
fn h5_a_request_accepts_the_same_drafts_alone_and_in_any_batch() {
    let request = |engine: &Engine| spec(3, tokens(61, 0, 0, 120), 90, engine.now());
    let mut alone = Engine::new(drafting(3, 0.7)).expect("runs");
    alone.submit(request(&alone)).unwrap();
    let (alone_yields, alone_outputs) = run_checked(&mut alone, 3);
    for others in [1, 4, 7] {
        let mut crowded = Engine::new(drafting(3, 0.7)).expect("runs");
        for id in (10..).take(others) {
            let other = spec(
                id,
                tokens(62, id as u32, 0, 40 + 30 * id as u32),
                60,
                crowded.now(),
            );
            crowded.submit(other).unwrap();
        }
        crowded.submit(request(&crowded)).unwrap();
        let (yields, outputs) = run_checked(&mut crowded, 3);
        assert_eq!(
            yields[&3], alone_yields[&3],
            "{others} others: the same drafts accepted"
        );
        assert_eq!(
            outputs[&3], alone_outputs[&3],
            "{others} others: the same tokens"
        );
    }
    // Drafts change how many steps an answer takes, never its tokens: a run without drafts writes the same.
    let mut plain = Engine::new(drafting(0, 0.0)).expect("runs");
    plain.submit(request(&plain)).unwrap();
    let (plain_yields, plain_outputs) = run_checked(&mut plain, 0);
    assert_eq!(plain_outputs[&3], alone_outputs[&3]);
    assert!(plain_yields[&3].len() > alone_yields[&3].len() + 20);
}

#[test]
fn h5_the_answer_never_passes_its_cap_or_its_stop_when_every_draft_is_accepted() {
    // Every draft accepted: four tokens a decode step, cut at the cap or at the stop token.
    for max_output in 1..=10 {
        for stop_after in [None, Some(1), Some(2), Some(3), Some(6)] {
            let mut engine = Engine::new(drafting(3, 1.0)).expect("runs");
            let mut request = spec(1, tokens(63, 0, 0, 50), max_output, engine.now());
            request.stop_after = stop_after;
            engine.submit(request).unwrap();
            let (yields, outputs) = run_checked(&mut engine, 3);
            let expected = stop_after.map_or(max_output, |stop| stop.min(max_output));
            let output = &outputs[&1];
            assert_eq!(
                output.len() as u32,
                expected,
                "cap {max_output}, stop {stop_after:?}"
            );
            assert_eq!(
                output.last() == Some(&STOP_TOKEN),
                stop_after.is_some_and(|stop| stop <= max_output),
                "cap {max_output}, stop {stop_after:?}: {output:?}"
            );
            // The prefill yields the first token; every decode step but the last yields four.
            let decoded = yields.get(&1).cloned().unwrap_or_default();
            if let Some((last, full)) = decoded.split_last() {
                assert!(full.iter().all(|n| *n == 4), "{decoded:?}");
                assert!((1..=4).contains(last));
            }
            assert_eq!(metrics_of(&engine, 1).decode_tokens, expected);
        }
    }
}

#[test]
fn h7_a_later_turn_restores_the_response_checkpoint_at_its_exact_boundary_with_drafts() {
    // A hybrid model (recurrent state, full attention, draft hidden state): a restore is a whole checkpoint
    // at its exact boundary (H2). The response checkpoint holds every token the answer computed, the accepted
    // drafts included and no rejected one: all but its last token. The next turn restores exactly those,
    // every page checked against recompute (E3).
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let mut params = geometry_params(policy, 257, 1, hybrid_groups());
        params.draft_tokens = 3;
        params.draft_acceptance = 0.85;
        let mut engine = Engine::new(params).expect("runs");
        let prompt = tokens(64, 0, 0, 70);
        engine
            .submit(spec(1, prompt.clone(), 37, engine.now()))
            .unwrap();
        let (first_yields, outputs) = run_checked(&mut engine, 3);
        assert!(first_yields[&1].iter().any(|n| *n > 1), "{first_yields:?}");
        let output = &outputs[&1];
        assert_eq!(output.len(), 37);
        engine.reset_prefix_cache().unwrap();
        let context = [&prompt[..], &output[..], &tokens(64, 1, 0, 20)[..]].concat();
        let mut turn = spec(2, context, 12, engine.now());
        turn.is_later_turn = true;
        engine.submit(turn).unwrap();
        let (_yields, outputs) = run_checked(&mut engine, 3);
        assert_eq!(outputs[&2].len(), 12);
        let metrics = metrics_of(&engine, 2);
        assert_eq!(
            metrics.prompt_tokens_restored,
            70 + 37 - 1,
            "{policy:?}: {metrics:?}"
        );
        assert!(engine.pages_verified() > 0, "{policy:?}");
        assert_eq!(engine.leaked_pages(), 0);
    }
}
