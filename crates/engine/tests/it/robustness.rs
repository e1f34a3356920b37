//! Robustness through the public API (K1-K3): a request that can never run is rejected alone and counted; no
//! sequence of calls makes the engine panic, and internal inconsistencies are errors; every path that asks the
//! store counts against one lookup budget, and a run that stops progressing fails with the stuck requests.

use std::time::Duration;

use checkpoint_transfer::{Fault, RESTORE_LOOKUPS_MAX};
use engine::{Engine, EngineParams, Error, Policy, PromptSource, RejectReason, RequestSpec};
use kv_pool::{RequestId, Timestamp};
use proptest::prelude::*;

use crate::agents::tokens;
use crate::contract::{TPP, params, seed_checkpoint, spec};

#[test]
fn k1_a_request_that_can_never_run_is_rejected_alone_and_counted_by_reason() {
    let mut params = params(Policy::Reserved, 65);
    params.geometry = EngineParams::full_attention_geometry(&params.cost, TPP, 2048).unwrap();
    let mut engine = Engine::new(params).unwrap();
    engine
        .submit(spec(1, tokens(1, 1, 0, 100), 8, Timestamp::ZERO))
        .unwrap();
    // Longer than the model's context.
    let too_long = engine.submit(spec(2, tokens(1, 2, 0, 2044), 8, Timestamp::ZERO));
    assert!(
        matches!(
            too_long,
            Err(Error::Rejected {
                request: RequestId(2),
                reason: RejectReason::LongerThanModel,
                tokens: 2052,
                limit: 2048,
            })
        ),
        "{too_long:?}"
    );
    // Fits the model, not the pool (64 usable pages of 16 tokens).
    let too_big = engine.submit(spec(3, tokens(1, 3, 0, 1100), 20, Timestamp::ZERO));
    assert!(
        matches!(
            too_big,
            Err(Error::Rejected {
                reason: RejectReason::LargerThanPool,
                limit: 1024,
                ..
            })
        ),
        "{too_big:?}"
    );
    assert!(
        too_big
            .unwrap_err()
            .to_string()
            .contains("larger_than_pool")
    );
    engine
        .submit(spec(4, tokens(1, 4, 0, 200), 8, Timestamp::ZERO))
        .unwrap();
    let _steps = engine.run_until_idle(10_000).unwrap();
    let metrics = engine.metrics();
    assert_eq!(metrics.requests_finished, 2, "every other request went on");
    assert_eq!(metrics.rejected_requests["longer_than_model"], 1);
    assert_eq!(metrics.rejected_requests["larger_than_pool"], 1);
    // A rejected id was never live: it may be submitted again, within the limits.
    engine
        .submit(spec(2, tokens(1, 2, 0, 100), 8, engine.now()))
        .unwrap();
}

/// A request keyed ahead (`RequestSpec::keyed`, as the replay does on its builder thread) runs exactly as the
/// same request submitted plainly; keys made for another block size, or none (size 0), are refused naming the
/// request and both sizes, and nothing changes.
/// K1 with a retained tail (issue 27, item 4): a sliding window of 16 tokens that retains 100 000 more keeps
/// every page it ever held, so a request needs its pages twice (full group and window). One that fits the pool
/// only once is refused at submit, naming the limit in tokens, where it used to be admitted and stop at the
/// pool's edge forever.
#[test]
fn k1_a_window_whose_retained_tail_keeps_every_page_counts_them_at_submit() {
    let group = |kind| kv_pool::CacheGroup {
        kind,
        bytes_per_page: 1024,
    };
    let geometry = kv_pool::Geometry::new(
        vec![
            group(kv_pool::GroupKind::Full),
            group(kv_pool::GroupKind::SlidingWindow {
                window_tokens: 16,
                retained_tail_tokens: 100_000,
            }),
        ],
        TPP,
        1,
        131_072,
    )
    .unwrap();
    let params = EngineParams {
        geometry,
        ..params(Policy::Reserved, 201)
    };
    let mut engine = Engine::new(params).unwrap();
    // 150 pages of tokens: 300 with the window's, above the 200 usable.
    let too_big = engine.submit(spec(1, tokens(1, 1, 0, 2392), 8, Timestamp::ZERO));
    assert!(
        matches!(
            too_big,
            Err(Error::Rejected {
                reason: RejectReason::LargerThanPool,
                tokens: 2400,
                limit: 1600,
                ..
            })
        ),
        "{too_big:?}"
    );
    // Half of it fits twice over, and finishes.
    engine
        .submit(spec(2, tokens(1, 2, 0, 1192), 8, Timestamp::ZERO))
        .unwrap();
    let _steps = engine.run_until_idle(10_000).unwrap();
    let finished = engine.take_finished();
    assert_eq!(finished.len(), 1);
    assert!(!finished[0].cancelled);
}

#[test]
fn a_keyed_request_runs_as_submitted_and_keys_for_another_block_size_are_refused() {
    let run = |keyed: bool| {
        let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
        let block_tokens = engine.params().geometry.block_tokens();
        for id in 0..4u64 {
            // Two requests share a prefix, so their keys meet in the prefix index.
            let prompt = tokens(3, (id % 2) as u32, 0, 5 * TPP + 3);
            let request = spec(id, prompt, 6, Timestamp::ZERO);
            if keyed {
                engine.submit_keyed(request.keyed(block_tokens)).unwrap();
            } else {
                engine.submit(request).unwrap();
            }
        }
        while !engine.is_idle() {
            engine.step().unwrap();
            engine.check_invariants().unwrap();
        }
        let outputs: Vec<_> = engine
            .take_finished()
            .into_iter()
            .map(|done| (done.id, done.output))
            .collect();
        (outputs, engine.metrics())
    };
    let (plain_out, plain) = run(false);
    let (keyed_out, keyed) = run(true);
    assert_eq!(plain_out, keyed_out);
    assert_eq!(plain.prompt_tokens_local_hit, keyed.prompt_tokens_local_hit);
    assert!(
        plain.prompt_tokens_local_hit > 0,
        "the shared prefix was hit"
    );
    assert_eq!(plain.requests_finished, keyed.requests_finished);

    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let block_tokens = engine.params().geometry.block_tokens();
    for wrong in [0, 1, block_tokens + 1, u32::MAX] {
        let request = spec(7, tokens(3, 0, 0, 3 * TPP), 4, Timestamp::ZERO).keyed(wrong);
        let error = engine.submit_keyed(request).unwrap_err();
        let Error::InvalidParam { name, reason } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*name, "block_tokens");
        assert!(reason.contains("req-7"), "{reason}");
        assert!(
            reason.contains(&format!("blocks of {wrong} tokens")),
            "{reason}"
        );
        assert!(reason.contains(&format!("hold {block_tokens}")), "{reason}");
    }
    assert!(engine.is_idle(), "nothing was submitted");
    // The largest output cap reserves no more than the prompt's own length again; the engine then rejects
    // the request as longer than any model (K1) without a huge allocation on the way.
    let prompt_len = 3 * TPP as usize;
    let huge = spec(8, tokens(3, 0, 0, 3 * TPP), u32::MAX, Timestamp::ZERO).keyed(block_tokens);
    assert!(huge.spec().prompt.capacity() <= 2 * prompt_len + 16);
    assert!(matches!(
        engine.submit_keyed(huge).unwrap_err(),
        Error::Rejected { .. }
    ));
    // The same request keyed right is taken.
    engine
        .submit_keyed(spec(7, tokens(3, 0, 0, 3 * TPP), 4, Timestamp::ZERO).keyed(block_tokens))
        .unwrap();
    assert!(!engine.is_idle());
}

/// A prompt source for the deferral tests: the tokens it generates, and after how many calls it starts
/// generating `later` instead (a source that is not deterministic).
#[derive(Debug)]
struct Source {
    tokens: Vec<u32>,
    later: Vec<u32>,
    honest_calls: usize,
    calls: std::sync::atomic::AtomicUsize,
}

impl Source {
    fn new(tokens: Vec<u32>, later: Vec<u32>, honest_calls: usize) -> std::sync::Arc<Source> {
        std::sync::Arc::new(Source {
            tokens,
            later,
            honest_calls,
            calls: std::sync::atomic::AtomicUsize::new(0),
        })
    }
}

impl PromptSource for Source {
    fn generate(&self, out: &mut Vec<u32>) {
        let call = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        out.extend_from_slice(if call < self.honest_calls {
            &self.tokens
        } else {
            &self.later
        });
    }
}

/// `keyed_from_source_in` is `keyed_from_source` whatever its buffer held before: the same keys, length and
/// outputs for prompts longer and shorter than the last, the buffer back with its capacity, and a refused
/// request leaves the buffer as it was.
#[test]
fn a_request_keyed_in_a_reused_buffer_is_the_request_keyed_alone() {
    let block_tokens = TPP;
    let mut scratch = vec![7u32; 5 * TPP as usize + 3];
    let run = |request: engine::KeyedRequest| {
        let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
        engine.submit_keyed(request).unwrap();
        engine.run_until_idle(10_000).unwrap();
        engine.take_finished().pop().unwrap().output
    };
    for (id, n_tokens) in [
        (1, 3 * TPP + 5),
        (2, TPP - 1),
        (3, 2 * TPP),
        (4, 4 * TPP + 1),
    ] {
        let prompt = tokens(id, 0, 0, n_tokens);
        let alone = spec(id, Vec::new(), 4, Timestamp::ZERO)
            .keyed_from_source(
                block_tokens,
                Source::new(prompt.clone(), prompt.clone(), usize::MAX),
            )
            .unwrap();
        let reused = spec(id, Vec::new(), 4, Timestamp::ZERO)
            .keyed_from_source_in(
                block_tokens,
                Source::new(prompt.clone(), prompt.clone(), usize::MAX),
                &mut scratch,
            )
            .unwrap();
        assert_eq!(reused.keys(), alone.keys(), "prompt of {n_tokens}");
        assert_eq!(reused.prompt_len(), prompt.len());
        assert!(reused.spec().prompt.is_empty(), "the tokens are not held");
        assert_eq!(scratch, prompt, "the buffer holds the prompt it generated");
        assert_eq!(run(reused), run(alone), "prompt of {n_tokens}");
    }
    let capacity = scratch.capacity();
    let held = scratch.clone();
    let prompt = tokens(9, 0, 0, TPP);
    let error = spec(9, prompt.clone(), 4, Timestamp::ZERO)
        .keyed_from_source_in(
            block_tokens,
            Source::new(prompt.clone(), prompt, usize::MAX),
            &mut scratch,
        )
        .unwrap_err();
    assert!(
        matches!(error, Error::InvalidParam { name: "prompt", .. }),
        "{error:?}"
    );
    assert_eq!(
        (scratch.capacity(), &scratch),
        (capacity, &held),
        "untouched"
    );
}

/// `params(Reserved, 64)` for a hybrid model (a full-attention group and a recurrent one): an engine that
/// reads a running request's whole prompt, so it generates a deferred prompt at submit.
fn hybrid_params() -> EngineParams {
    let mut hybrid = params(Policy::Reserved, 64);
    let bytes_per_page = hybrid.geometry.groups()[0].bytes_per_page;
    hybrid.geometry = kv_pool::Geometry::new(
        vec![
            kv_pool::CacheGroup {
                kind: kv_pool::GroupKind::Full,
                bytes_per_page,
            },
            kv_pool::CacheGroup {
                kind: kv_pool::GroupKind::Recurrent,
                bytes_per_page,
            },
        ],
        TPP,
        1,
        hybrid.geometry.max_model_len(),
    )
    .unwrap();
    hybrid
}

/// A prompt of `segments` segments of 2 blocks each, segment `i` named `i`: it generates `tokens` whole, and
/// from a position on `tail` (another tail or length after `honest_calls` calls: a source that changed).
#[derive(Debug)]
struct SegmentSource {
    ids: Vec<u64>,
    tokens: Vec<u32>,
    tail: Vec<u32>,
    honest_calls: usize,
    whole: std::sync::atomic::AtomicUsize,
    from: std::sync::atomic::AtomicUsize,
}

impl SegmentSource {
    fn new(tokens: Vec<u32>, tail: Vec<u32>, honest_calls: usize) -> std::sync::Arc<SegmentSource> {
        std::sync::Arc::new(SegmentSource {
            ids: (0..tokens.len().div_ceil(2 * TPP as usize) as u64).collect(),
            tokens,
            tail,
            honest_calls,
            whole: std::sync::atomic::AtomicUsize::new(0),
            from: std::sync::atomic::AtomicUsize::new(0),
        })
    }
}

impl PromptSource for SegmentSource {
    fn generate(&self, out: &mut Vec<u32>) {
        self.whole
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.generate_from(0, out);
    }

    fn generate_from(&self, start: usize, out: &mut Vec<u32>) {
        let call = self.from.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tokens = if call < self.honest_calls {
            &self.tokens
        } else {
            &self.tail
        };
        out.extend_from_slice(tokens.get(start..).unwrap_or_default());
    }

    fn segments(&self) -> Option<engine::Segments<'_>> {
        Some(engine::Segments {
            ids: &self.ids,
            tokens: 2 * TPP,
            len: self.tokens.len(),
        })
    }
}

/// A source whose segments key its blocks is keyed without generating its prompt: it generates only the
/// tokens the request holds (its partial last block and last few), and runs as the same prompt held does. A
/// source that generates another length than its segments' is refused when keyed; one that generates
/// another tail or length later is refused where the prompt is read again, naming the source.
#[test]
fn a_request_keyed_by_segments_generates_only_what_it_holds_and_a_source_that_changes_fails_where_read()
 {
    let prompt = tokens(8, 0, 0, 5 * TPP + 3);
    let block_tokens = TPP;
    let from_source = |source: std::sync::Arc<SegmentSource>| {
        spec(4, Vec::new(), 4, Timestamp::ZERO).keyed_from_source(block_tokens, source)
    };
    let source = SegmentSource::new(prompt.clone(), prompt.clone(), usize::MAX);
    let request = from_source(source.clone()).unwrap();
    assert_eq!(request.prompt_len(), prompt.len());
    assert_eq!(request.keys().len(), 5);
    assert_ne!(
        request.keys(),
        spec(4, prompt.clone(), 4, Timestamp::ZERO)
            .keyed(block_tokens)
            .keys(),
        "keyed by segments, not by tokens"
    );
    let calls = |source: &SegmentSource| {
        (
            source.whole.load(std::sync::atomic::Ordering::Relaxed),
            source.from.load(std::sync::atomic::Ordering::Relaxed),
        )
    };
    assert_eq!(calls(&source), (0, 1), "only the held tail was generated");
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    engine.submit_keyed(request).unwrap();
    engine.run_until_idle(10_000).unwrap();
    let output = engine.take_finished().pop().unwrap().output;
    engine
        .submit(spec(4, prompt.clone(), 4, Timestamp::ZERO))
        .unwrap();
    engine.run_until_idle(10_000).unwrap();
    assert_eq!(engine.take_finished().pop().unwrap().output, output);
    assert_eq!(
        calls(&source),
        (0, 1),
        "never read again on the simulated executor"
    );
    // Another length than its segments': refused at once.
    let short = SegmentSource::new(prompt.clone(), prompt[..prompt.len() - 1].to_vec(), 0);
    let error = from_source(short).unwrap_err();
    let Error::InvalidParam { name, reason } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*name, "prompt_source");
    assert!(reason.contains("req-4"), "{reason}");
    // An engine that reads whole prompts generates it at submit: an honest source runs, one whose tail or
    // length changed is refused, and nothing is taken.
    let mut engine = Engine::new(hybrid_params()).unwrap();
    let mut other_tail = prompt.clone();
    *other_tail.last_mut().unwrap() ^= 1;
    let mut longer = prompt.clone();
    longer.push(1);
    for changed in [other_tail, longer] {
        let error = engine
            .submit_keyed(from_source(SegmentSource::new(prompt.clone(), changed, 1)).unwrap())
            .unwrap_err();
        let Error::InvalidParam { name, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*name, "prompt_source");
        assert!(engine.is_idle(), "nothing was taken");
    }
    let honest = SegmentSource::new(prompt.clone(), prompt.clone(), usize::MAX);
    engine
        .submit_keyed(from_source(honest.clone()).unwrap())
        .unwrap();
    engine.run_until_idle(10_000).unwrap();
    assert_eq!(engine.take_finished().pop().unwrap().output, output);
    assert_eq!(calls(&honest), (1, 2), "generated whole once, at submit");
}

#[test]
fn a_request_keyed_from_a_prompt_source_is_checked_like_any_and_a_source_that_changes_fails_where_read()
 {
    let prompt = tokens(3, 0, 0, 3 * TPP);
    let block_tokens = TPP;
    let mut other = prompt.clone();
    other[5] ^= 1;
    let from_source = |id: u64, source: std::sync::Arc<Source>| {
        spec(id, Vec::new(), 4, Timestamp::ZERO).keyed_from_source(block_tokens, source)
    };
    // A prompt and a source both: refused, naming the prompt.
    let error = spec(1, prompt.clone(), 4, Timestamp::ZERO)
        .keyed_from_source(
            block_tokens,
            Source::new(prompt.clone(), prompt.clone(), usize::MAX),
        )
        .unwrap_err();
    let Error::InvalidParam { name, reason } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*name, "prompt");
    assert!(reason.contains("req-1"), "{reason}");
    // A prompt from a source is checked by its length like a held one: empty, or an instruction boundary
    // past it, is refused at submit.
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let empty = from_source(2, Source::new(Vec::new(), Vec::new(), usize::MAX)).unwrap();
    assert!(matches!(
        engine.submit_keyed(empty),
        Err(Error::EmptyPrompt { .. })
    ));
    let mut past = spec(3, Vec::new(), 4, Timestamp::ZERO);
    past.instruction_tokens = Some(prompt.len() as u32);
    let past = past
        .keyed_from_source(
            block_tokens,
            Source::new(prompt.clone(), prompt.clone(), usize::MAX),
        )
        .unwrap();
    assert!(matches!(
        engine.submit_keyed(past),
        Err(Error::InvalidParam {
            name: "instruction_tokens",
            ..
        })
    ));
    assert!(engine.is_idle(), "nothing was taken");
    // The simulated executor on one full-attention group never reads the prompt again: a source that would
    // generate other tokens is never asked, and the request produces what a held prompt does, with the
    // same keys.
    let changing = || from_source(4, Source::new(prompt.clone(), other.clone(), 1)).unwrap();
    let request = changing();
    assert_eq!(request.prompt_len(), prompt.len());
    assert!(request.spec().prompt.is_empty(), "the tokens are not held");
    assert_eq!(
        request.keys(),
        spec(4, prompt.clone(), 4, Timestamp::ZERO)
            .keyed(block_tokens)
            .keys()
    );
    engine.submit_keyed(request).unwrap();
    engine.run_until_idle(10_000).unwrap();
    let deferred_output = engine.take_finished().pop().unwrap().output;
    engine
        .submit(spec(4, prompt.clone(), 4, Timestamp::ZERO))
        .unwrap();
    engine.run_until_idle(10_000).unwrap();
    assert_eq!(
        engine.take_finished().pop().unwrap().output,
        deferred_output
    );
    // A verified restore into it generates it again: the step fails naming the source, as any mismatch a
    // verification finds stops the run (E3), and nothing panics.
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    assert!(engine.params().verify_restores);
    engine
        .submit(spec(10, prompt.clone(), 4, Timestamp::ZERO))
        .unwrap();
    engine.run_until_idle(10_000).unwrap();
    engine.force_reset_prefix_cache().unwrap();
    engine.submit_keyed(changing()).unwrap();
    let error = crate::first_error(&mut engine, "a changed prompt under verification");
    let Error::InvalidParam { name, reason } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*name, "prompt_source");
    assert!(reason.contains("req-4"), "{reason}");
    // An engine that reads a running request's whole prompt (here a hybrid model) generates it at submit:
    // a source that changed is refused there, naming it, and nothing is taken.
    let mut engine = Engine::new(hybrid_params()).unwrap();
    let error = engine.submit_keyed(changing()).unwrap_err();
    let Error::InvalidParam { name, reason } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*name, "prompt_source");
    assert!(reason.contains("req-4"), "{reason}");
    assert!(engine.is_idle(), "nothing was taken");
    let honest = from_source(4, Source::new(prompt.clone(), prompt.clone(), usize::MAX)).unwrap();
    engine.submit_keyed(honest).unwrap();
    engine.run_until_idle(10_000).unwrap();
    assert_eq!(engine.take_finished().len(), 1);
    // A request cancelled while it waits leaves nothing behind.
    let mut engine = Engine::new(params(Policy::Reserved, 64)).unwrap();
    let waiting = spec(
        5,
        Vec::new(),
        4,
        Timestamp::ZERO.after(Duration::from_secs(5)),
    )
    .keyed_from_source(
        block_tokens,
        Source::new(prompt.clone(), prompt, usize::MAX),
    )
    .unwrap();
    engine.submit_keyed(waiting).unwrap();
    engine.step().unwrap();
    engine.cancel(RequestId(5)).unwrap();
    engine.check_invariants().unwrap();
    assert!(engine.is_idle());
    assert_eq!(engine.pool().n_in_use(), 0);
}

#[test]
fn k3_lookups_after_preemptions_and_evictions_count_against_one_budget() {
    // The review's livelock: under pages-only every preemption asked the store again, without a cap. A pool
    // much smaller than the sessions' contexts preempts constantly; no request may exceed the budget, and
    // the run ends.
    for policy in [Policy::PagesOnly, Policy::Reserved, Policy::Ordinary] {
        let agents = crate::agents::Agents {
            n_agents: 16,
            turns: 6,
            first_prompt_tokens: 1024,
            turn_input_tokens: 32,
            response_tokens: 224,
            think_s: 2.0,
            seed: 1,
        };
        let run = crate::agents::run_agents(params(policy, 513), agents, 1);
        assert_eq!(run.metrics.requests_finished, 16 * 6, "{policy}");
        assert!(run.metrics.preemptions > 0, "{policy}: under pressure");
    }
}

#[test]
fn k3_every_request_sends_at_most_the_lookup_budget_under_pressure() {
    for policy in [Policy::PagesOnly, Policy::Reserved] {
        let mut engine = Engine::new(EngineParams {
            max_running: 8,
            chunk_tokens: 64,
            ..params(policy, 96)
        })
        .unwrap();
        let history: Vec<Vec<u32>> = (0..6).map(|i| tokens(3, i, 0, 40 * TPP)).collect();
        for (i, prompt) in history.iter().enumerate() {
            seed_checkpoint(&mut engine, 100 + i as u64, prompt, 1);
        }
        for (i, prompt) in history.into_iter().enumerate() {
            let mut prompt = prompt;
            prompt.extend(tokens(3, i as u32, 1, 5 * TPP));
            engine
                .submit(spec(i as u64, prompt, 40, engine.now()))
                .unwrap();
        }
        let _steps = engine.run_until_idle(200_000).unwrap();
        for metrics in engine.request_metrics() {
            assert!(
                metrics.lookups <= RESTORE_LOOKUPS_MAX,
                "{policy}: {:?} sent {} lookups",
                metrics.id,
                metrics.lookups
            );
        }
        if policy == Policy::PagesOnly {
            assert!(engine.metrics().preemptions > 0, "{policy}: under pressure");
        }
    }
}

#[test]
fn k3_a_run_that_stops_progressing_fails_naming_the_stuck_requests() {
    let mut engine = Engine::new(EngineParams {
        stall_timeout: Duration::from_secs(30),
        ..params(Policy::Reserved, 64)
    })
    .unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    // A copy that takes a day: nothing else runs, so nothing progresses.
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(86_400),
        })
        .expect("inline copies take faults");
    engine.submit(spec(7, prompt, 4, engine.now())).unwrap();
    let error = crate::first_error(&mut engine, "the stall");
    let Error::Stalled { requests, .. } = &error else {
        panic!("{error}");
    };
    assert!(requests.contains("req-7"), "{error}");
    assert!(error.to_string().contains("no progress"), "{error}");
    // The engine is intact: the stuck request can be cancelled and the run goes on.
    engine.cancel(RequestId(7)).unwrap();
    engine.check_invariants().unwrap();
}

/// One call of the public API with arbitrary (often invalid) arguments.
#[derive(Clone, Debug)]
enum Call {
    Submit {
        id: u64,
        len: u32,
        out: u32,
        logits: bool,
        stream: bool,
        /// 0: `submit`; 1: `submit_keyed` with the engine's block size; 2: keyed for another block size; 3:
        /// keyed from a prompt source (one that changes is refused or stops a verified run:
        /// `a_request_keyed_from_a_prompt_source_...`).
        keyed: u8,
    },
    Cancel {
        id: u64,
    },
    Resume {
        id: u64,
        len: u32,
        out: u32,
    },
    Close {
        id: u64,
    },
    Reset {
        forced: bool,
    },
    Step,
    Advance {
        ms: u64,
    },
    Fault {
        kind: u8,
        page: u32,
    },
    Forget,
}

fn call() -> impl Strategy<Value = Call> {
    let id = 0u64..6;
    prop_oneof![
        3 => (id.clone(), 0u32..300, 0u32..20, any::<bool>(), any::<bool>(), 0u8..4)
            .prop_map(|(id, len, out, logits, stream, keyed)| Call::Submit { id, len, out, logits, stream, keyed }),
        1 => id.clone().prop_map(|id| Call::Cancel { id }),
        1 => (id.clone(), 0u32..40, 0u32..4).prop_map(|(id, len, out)| Call::Resume { id, len, out }),
        1 => id.prop_map(|id| Call::Close { id }),
        1 => any::<bool>().prop_map(|forced| Call::Reset { forced }),
        6 => Just(Call::Step),
        1 => (0u64..5000).prop_map(|ms| Call::Advance { ms }),
        1 => (0u8..3, 0u32..70).prop_map(|(kind, page)| Call::Fault { kind, page }),
        1 => Just(Call::Forget),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(64)
    ))]

    /// K2: no sequence of public calls, with ids that are unknown, reused or live and sizes from empty to
    /// larger than the pool, makes the engine panic; every call returns a value, the invariants hold after
    /// each, and once the calls stop and every stream is closed the engine drains with no page in use.
    #[test]
    fn k2_no_sequence_of_public_calls_panics(calls in proptest::collection::vec(call(), 1..120)) {
        for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
            let mut engine = Engine::new(EngineParams {
                max_running: 3,
                chunk_tokens: 32,
                restore_max_wait: Duration::from_millis(500),
                ..params(policy, 24)
            }).unwrap();
            for call in &calls {
                apply(&mut engine, call);
                engine.check_invariants().unwrap();
            }
            for _ in 0..100_000 {
                if engine.is_idle() {
                    break;
                }
                for id in 0..6 {
                    let _closed = engine.close_stream(RequestId(id));
                }
                engine.step().unwrap();
                engine.check_invariants().unwrap();
            }
            for id in 0..6 {
                let _closed = engine.close_stream(RequestId(id));
            }
            prop_assert!(engine.is_idle());
            prop_assert_eq!(engine.pool().n_in_use(), 0);
            prop_assert_eq!(engine.metrics().leaked_pages, 0);
        }
    }
}

fn apply(engine: &mut Engine, call: &Call) {
    match *call {
        Call::Submit {
            id,
            len,
            out,
            logits,
            stream,
            keyed,
        } => {
            let mut request =
                RequestSpec::new(id, tokens(5, id as u32 % 2, 0, len), out, engine.now());
            request.saved_logits = logits;
            request.streaming = stream;
            request.is_later_turn = true;
            let block_tokens = engine.params().geometry.block_tokens();
            let _result = match keyed {
                0 => engine.submit(request),
                1 => engine.submit_keyed(request.keyed(block_tokens)),
                2 => {
                    engine.submit_keyed(request.keyed(u32::from(id % 2 == 0) * (block_tokens + 1)))
                }
                _ => {
                    let prompt = std::mem::take(&mut request.prompt);
                    request
                        .keyed_from_source(
                            block_tokens,
                            Source::new(prompt.clone(), prompt, usize::MAX),
                        )
                        .and_then(|keyed| engine.submit_keyed(keyed))
                }
            };
        }
        Call::Cancel { id } => {
            let _result = engine.cancel(RequestId(id));
        }
        Call::Resume { id, len, out } => {
            let _result = engine.resume(RequestId(id), &tokens(6, id as u32, 1, len), out);
        }
        Call::Close { id } => {
            let _result = engine.close_stream(RequestId(id));
        }
        Call::Reset { forced } => {
            let _result = if forced {
                engine.force_reset_prefix_cache()
            } else {
                engine.reset_prefix_cache()
            };
        }
        Call::Step => {
            engine.step().unwrap();
        }
        Call::Advance { ms } => {
            let to = engine.now().after(Duration::from_millis(ms));
            engine.advance_clock(to);
        }
        Call::Fault { kind, page } => engine
            .inject_copy_fault(match kind {
                0 => Fault::FailNext { rank: 0 },
                1 => Fault::DelayNext {
                    rank: 0,
                    by: Duration::from_millis(u64::from(page) * 10),
                },
                _ => Fault::EvictDestination(kv_pool::PageId(page)),
            })
            .expect("inline copies take faults"),
        Call::Forget => engine
            .forget_checkpoints()
            .expect("a simulated store is replaced"),
    }
}

#[test]
fn l5_a_corrupted_copy_is_caught_naming_the_request_the_page_and_the_byte() {
    let mut engine = Engine::new(EngineParams {
        verify_restores: true,
        ..params(Policy::Reserved, 64)
    })
    .unwrap();
    let history = tokens(4, 0, 0, 6 * TPP);
    seed_checkpoint(&mut engine, 1, &history, 1);
    // The copy completes as done, with one byte of its first page inverted.
    engine
        .inject_copy_fault(Fault::CorruptNext { rank: 0, byte: 5 })
        .expect("inline copies take faults");
    let mut prompt = history;
    prompt.extend(tokens(4, 0, 1, 8));
    engine.submit(spec(9, prompt, 4, engine.now())).unwrap();
    let error = crate::first_error(&mut engine, "the corruption");
    let Error::RestoreMismatch {
        request,
        block,
        byte,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((*request, *block, *byte), (RequestId(9), 0, 5), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("req-9") && message.contains("byte 5") && message.contains("page"),
        "{message}"
    );
}

#[test]
fn l6_shutdown_drains_copies_releases_everything_and_reports_what_it_cancelled() {
    let mut engine = Engine::new(params(Policy::Reserved, 96)).unwrap();
    let history = tokens(5, 0, 0, 10 * TPP);
    seed_checkpoint(&mut engine, 1, &history, 1);
    // A paused stream, a running decode, a restore whose copy is in flight, and a request waiting.
    let mut stream = spec(2, tokens(5, 2, 0, 3 * TPP), 1, engine.now());
    stream.streaming = true;
    engine.submit(stream).unwrap();
    engine
        .submit(spec(3, tokens(5, 3, 0, 20 * TPP), 1000, engine.now()))
        .unwrap();
    engine
        .inject_copy_fault(Fault::DelayNext {
            rank: 0,
            by: Duration::from_secs(600),
        })
        .expect("inline copies take faults");
    let mut restore = history;
    restore.extend(tokens(5, 0, 1, 8));
    engine.submit(spec(4, restore, 4, engine.now())).unwrap();
    for _ in 0..20 {
        engine.step().unwrap();
    }
    engine
        .submit(spec(5, tokens(5, 5, 0, 80 * TPP), 4, engine.now()))
        .unwrap();
    engine.step().unwrap();
    assert!(engine.pool().n_in_use() > 0);
    let report = engine.shutdown().unwrap();
    let mut cancelled = report.cancelled.clone();
    cancelled.sort();
    assert_eq!(cancelled, [2, 3, 4, 5].map(RequestId), "{report:?}");
    assert_eq!(
        report.copies_drained, 1,
        "the restore's copy was waited for"
    );
    assert_eq!(engine.pool().n_in_use(), 0, "every page is free");
    assert_eq!(engine.metrics().leaked_pages, 0);
    assert!(engine.is_idle());
    engine.check_invariants().unwrap();
    let finished = engine.take_finished();
    assert!(finished.iter().filter(|f| f.id.0 > 1).all(|f| f.cancelled));
    // The engine goes on after a shutdown.
    engine
        .submit(spec(6, tokens(5, 6, 0, 2 * TPP), 2, engine.now()))
        .unwrap();
    let _steps = engine.run_until_idle(1000).unwrap();
    assert_eq!(engine.pool().n_in_use(), 0);
}

#[test]
fn a_geometry_the_step_loop_cannot_run_is_refused_naming_the_group_and_why() {
    use kv_pool::{CacheGroup, Geometry, GroupKind};
    let full = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 1024,
    };
    let window = CacheGroup {
        kind: GroupKind::SlidingWindow {
            window_tokens: 4096,
            retained_tail_tokens: 0,
        },
        bytes_per_page: 1024,
    };
    let refusal = |groups: Vec<CacheGroup>, ranks: u32| {
        let params = EngineParams {
            geometry: Geometry::new(groups, TPP, ranks, 8192).unwrap(),
            ..crate::verified_defaults()
        };
        Engine::new(params).unwrap_err().to_string()
    };
    // A sliding window runs (H3); without a full-attention group, or with two, the step loop has no one
    // block table.
    assert!(
        Engine::new(EngineParams {
            geometry: Geometry::new(vec![full, window], TPP, 1, 8192).unwrap(),
            ..crate::verified_defaults()
        })
        .is_ok()
    );
    let message = refusal(vec![full, full], 2);
    assert!(
        message.contains("cache group 1 is a second full-attention group"),
        "{message}"
    );
    let recurrent = CacheGroup {
        kind: GroupKind::Recurrent,
        bytes_per_page: 1024,
    };
    let message = refusal(vec![recurrent, window], 1);
    assert!(
        message.contains("no cache group is full attention"),
        "{message}"
    );
}

#[test]
fn restore_gauges_see_copies_waiters_and_owned_imports_under_every_policy() {
    for policy in [Policy::PagesOnly, Policy::Reserved] {
        let mut engine = Engine::new(params(policy, 96)).unwrap();
        let history = tokens(6, 0, 0, 10 * TPP);
        seed_checkpoint(&mut engine, 1, &history, 1);
        engine
            .inject_copy_fault(Fault::DelayNext {
                rank: 0,
                by: Duration::from_secs(10),
            })
            .expect("inline copies take faults");
        let mut restore = history;
        restore.extend(tokens(6, 0, 1, 8));
        engine.submit(spec(2, restore, 4, engine.now())).unwrap();
        // The lookup answers a lookup latency after the first step; the copy starts then.
        for _ in 0..10 {
            engine.step().unwrap();
            if engine.restore_gauges().copies_in_flight > 0 {
                break;
            }
        }
        let gauges = engine.restore_gauges();
        assert_eq!(gauges.importing, [RequestId(2)], "{policy}: {gauges:?}");
        assert_eq!(gauges.copies_in_flight, 1, "{policy}");
        assert!(gauges.waiters.is_empty(), "{policy}");
    }
}

#[test]
fn threaded_copies_move_real_bytes_while_steps_run_under_every_policy() {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let agents = crate::agents::Agents {
            n_agents: 4,
            turns: 4,
            first_prompt_tokens: 512,
            turn_input_tokens: 32,
            response_tokens: 64,
            think_s: 1.0,
            seed: 3,
        };
        let params = EngineParams {
            copy_engine: engine::CopyEngineKind::Threaded { workers: 2 },
            verify_restores: true,
            ..params(policy, 129)
        };
        let run = crate::agents::run_agents(params, agents, 1);
        assert_eq!(run.metrics.requests_finished, 16, "{policy}");
        assert_eq!(run.metrics.leaked_pages, 0, "{policy}");
        if policy == Policy::Reserved {
            assert!(
                run.metrics.later_turns_restored > 0,
                "{policy}: {:?}",
                run.metrics
            );
            assert!(
                run.pages_verified > 0,
                "restored pages written by the worker threads equal recompute (E3)"
            );
        }
    }
}

#[test]
fn an_unavailable_copy_engine_is_refused_when_the_engine_is_built() {
    let threaded = EngineParams {
        copy_engine: engine::CopyEngineKind::Threaded { workers: 0 },
        ..params(Policy::Reserved, 64)
    };
    let message = Engine::new(threaded).unwrap_err().to_string();
    assert!(message.contains("1 to 64 workers"), "{message}");
    // Faults are the inline engine's: the threaded one refuses them with an error, not a panic.
    let mut engine = Engine::new(EngineParams {
        copy_engine: engine::CopyEngineKind::Threaded { workers: 1 },
        ..params(Policy::Reserved, 64)
    })
    .unwrap();
    let refused = engine.inject_copy_fault(Fault::FailNext { rank: 0 });
    assert!(
        refused.is_err_and(|error| error.to_string().contains("inline copy engine")),
        "threaded copies take no fault"
    );
}

/// Issue 27, item 8: calls that could never do what they say are refused naming the parameter, changing
/// nothing: a resume asking for no output (as `submit` refuses 0) and a copy fault on a rank the engine does
/// not have (it would never fire).
#[test]
fn a_resume_for_no_output_and_a_fault_on_a_missing_rank_are_refused_naming_the_parameter() {
    let mut engine = Engine::new(params(Policy::Reserved, 65)).unwrap();
    let mut stream = spec(1, tokens(3, 1, 0, 40), 2, Timestamp::ZERO);
    stream.streaming = true;
    engine.submit(stream).unwrap();
    while engine
        .request(RequestId(1))
        .is_none_or(|view| view.phase != engine::RequestPhase::Paused)
    {
        engine.step().unwrap();
    }
    let refused = engine.resume(RequestId(1), &[5; 4], 0);
    assert!(
        matches!(
            refused,
            Err(Error::InvalidParam {
                name: "max_output_tokens",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        engine.request(RequestId(1)).unwrap().phase,
        engine::RequestPhase::Paused
    );
    for fault in [
        Fault::FailNext { rank: 1 },
        Fault::DelayNext {
            rank: u32::MAX,
            by: Duration::from_secs(1),
        },
        Fault::CorruptNext { rank: 7, byte: 0 },
        Fault::FailInFlight { rank: 99 },
    ] {
        let refused = engine.inject_copy_fault(fault);
        assert!(
            matches!(refused, Err(Error::InvalidParam { name: "rank", .. })),
            "{fault:?}: {refused:?}"
        );
    }
    engine
        .inject_copy_fault(Fault::FailNext { rank: 0 })
        .unwrap();
    engine.resume(RequestId(1), &[5; 4], 1).unwrap();
    let _steps = engine.run_until_idle(10_000).unwrap();
}
