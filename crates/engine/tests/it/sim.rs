//! The deterministic simulation: on one full-attention group or a hybrid model (sliding-window,
//! chunked-local, recurrent and auxiliary groups), on one to three context-parallel ranks, with or without
//! drafts (accepted at several rates), random requests (shared session prefixes, streams, early stops), cancellations,
//! forced and non-forced resets, copy failures and delays on any rank, clock jumps and (every fourth seed) a store
//! small enough to evict checkpoints under every policy, sessions going on from a finished turn's answer (a
//! hybrid model's local hit, H9), with every
//! invariant checked after every step (no leaked page, no page freed under a live copy, credits consistent
//! with the pool, slots within the limit, FCFS among requests that own no capacity) and every request
//! finished or cancelled at the end. The seed is printed on failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use checkpoint_transfer::Fault;
use engine::{Engine, EngineParams, Policy, Preemption, PromptSource, RequestSpec};
use kv_pool::RequestId;

use crate::agents::tokens;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A prompt held by the test, handed to the engine as its source (`RequestSpec::keyed_from_source`).
#[derive(Debug)]
struct HeldPrompt(Vec<u32>);

impl PromptSource for HeldPrompt {
    fn generate(&self, out: &mut Vec<u32>) {
        out.extend_from_slice(&self.0);
    }
}

/// Which requests a simulation submits with their prompts deferred to a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defer {
    None,
    /// Requests with an even id (decided by the id, so every random draw stays what it was).
    EvenIds,
}

/// What one simulation produced: every finished request (outputs and metrics) and the engine's run metrics,
/// printed; and the prompt tokens a hybrid model served as local hits (H9).
struct Simulated {
    outcome: String,
    hybrid_local_hits: u64,
}

/// Runs one simulation.
fn simulate(policy: Policy, seed: u64, n_ops: u32, defer: Defer) -> Simulated {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // One to three context-parallel ranks (H4): a block is 16 tokens on each rank. One full-attention
    // group, a hybrid model (windows, recurrent state, auxiliary pages, mixed), or the shape of a shipped model
    // preset (`docs/presets.md`: its groups, page width, ranks and draft depth; the sliding window scaled to
    // these short prompts).
    let mut n_ranks = 1 + rng.below(3) as u32;
    let mut tokens_per_page = 16;
    let mut draft_tokens = [0, 0, 1, 3][rng.below(4) as usize];
    let defaults = crate::verified_defaults();
    let group = |kind| kv_pool::CacheGroup {
        kind,
        bytes_per_page: 1024,
    };
    let (full, recurrent) = (kv_pool::GroupKind::Full, kv_pool::GroupKind::Recurrent);
    let sliding = kv_pool::GroupKind::SlidingWindow {
        window_tokens: 24 + rng.below(64) as u32,
        retained_tail_tokens: rng.below(2) as u32 * 8,
    };
    let chunked = kv_pool::GroupKind::ChunkedLocal {
        chunk_tokens: 16 + rng.below(80) as u32,
    };
    let groups = match rng.below(7) {
        0 => defaults.geometry.groups().to_vec(),
        // The linear-hybrid preset's shape.
        1 => vec![group(full), group(recurrent)],
        2 => vec![
            group(recurrent),
            group(full),
            group(recurrent),
            group(kv_pool::GroupKind::Auxiliary { pages: 2 }),
        ],
        // The sliding-window preset's shape.
        3 => vec![group(full), group(sliding)],
        4 => vec![group(full), group(chunked), group(recurrent)],
        // The glm-mla-hybrid preset: MLA with 64-token pages, three recurrent groups, two ranks, three
        // draft tokens.
        5 => {
            (tokens_per_page, n_ranks, draft_tokens) = (64, 2, 3);
            vec![
                group(full),
                group(recurrent),
                group(recurrent),
                group(recurrent),
            ]
        }
        _ => vec![group(sliding), group(full), group(chunked)],
    };
    let geometry = kv_pool::Geometry::new(
        groups,
        tokens_per_page,
        n_ranks,
        defaults.geometry.max_model_len(),
    )
    .expect("a valid geometry");
    let hybrid = geometry.groups().len() > 1;
    let block_tokens = geometry.block_tokens() as usize;
    let params = EngineParams {
        geometry,
        policy,
        n_pages: 64 + rng.below(96) as u32,
        max_running: 1 + rng.below(6) as u32,
        max_batched_tokens: 64 + rng.below(512) as u32,
        chunk_tokens: 16 + rng.below(256) as u32,
        restore_max_wait: Duration::from_millis(rng.below(3000)),
        watermark_pages: rng.below(4) as u32,
        copy_task_limit: 1 + rng.below(4) as u32,
        capture_prefill_tail: rng.below(2) == 0,
        // Every third seed preempts by recompute, the others offload (drawn outside `rng`, so that the other
        // draws of a seed stay what they were).
        preemption: if seed.is_multiple_of(3) {
            Preemption::Recompute
        } else {
            Preemption::Offload
        },
        // Draft decoding: restores without draft state replay their last page (H5); a decode step yields 1 to
        // 1 + draft_tokens tokens, its drafts accepted with a probability decided by the seed, outside `rng`.
        draft_tokens,
        draft_acceptance: [0.0, 0.5, 0.85, 1.0][(seed / 2 % 4) as usize],
        // Every fourth seed has a store of a few dozen pages, which evicts checkpoints between a lookup's
        // answer and the reservation (G3); decided by the seed, outside `rng`.
        store_capacity_pages: if seed % 4 == 1 {
            16 + seed % 64
        } else {
            defaults.store_capacity_pages
        },
        seed,
        ..defaults
    };
    let mut engine = Engine::new(params).expect("valid params");
    let mut sessions: Vec<Vec<u32>> = (0..4)
        .map(|s| tokens(seed, s, 0, 40 + rng.below(300) as u32))
        .collect();
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    // The prompt of every live request: a session continues from an even request's whole context, its
    // answer included, as an agent's next turn does (a hybrid model's local hit, H9).
    let mut prompts: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut next_id = 0u64;
    let mut outcome = String::new();
    for _ in 0..n_ops {
        match rng.below(100) {
            0..=39 => {
                let session = rng.below(sessions.len() as u64) as usize;
                if live.values().any(|s| *s == session) {
                    continue;
                }
                let mut prompt = sessions[session].clone();
                prompt.extend(tokens(
                    seed,
                    session as u32,
                    next_id as u32,
                    1 + rng.below(40) as u32,
                ));
                if prompt.len() > 900 {
                    prompt = tokens(seed, session as u32, next_id as u32 + 7, 50);
                    sessions[session] = prompt.clone();
                }
                if rng.below(4) == 0 && prompt.len() > block_tokens {
                    // Page-aligned prompts: with saved logits, a whole-prompt restore (Q4).
                    prompt.truncate(prompt.len() / block_tokens * block_tokens);
                }
                let arrival = engine.now().after(Duration::from_millis(rng.below(200)));
                let mut spec = RequestSpec::new(next_id, prompt, 1 + rng.below(40) as u32, arrival);
                spec.salt = vec![(session % 2) as u8];
                spec.is_later_turn = true;
                spec.stop_after = (rng.below(4) == 0).then(|| 1 + rng.below(8) as u32);
                spec.priority = 0;
                spec.saved_logits = rng.below(3) == 0;
                // An instruction boundary: a chunk ends there and its checkpoint is published (H7).
                spec.instruction_tokens = (rng.below(4) == 0 && spec.prompt.len() > 2)
                    .then(|| 1 + rng.below(spec.prompt.len() as u64 - 1) as u32);
                spec.streaming = rng.below(10) == 0;
                prompts.insert(next_id, spec.prompt.clone());
                if defer == Defer::EvenIds && next_id.is_multiple_of(2) {
                    let source = Arc::new(HeldPrompt(std::mem::take(&mut spec.prompt)));
                    let keyed = spec
                        .keyed_from_source(block_tokens as u32, source)
                        .expect("a request with no prompt of its own");
                    engine.submit_keyed(keyed).expect("submit");
                } else {
                    engine.submit(spec).expect("submit");
                }
                live.insert(next_id, session);
                next_id += 1;
            }
            40..=44 => {
                if let Some((&id, _)) = live.iter().nth(rng.below(live.len() as u64 + 1) as usize) {
                    engine.cancel(RequestId(id)).expect("cancel a live request");
                }
            }
            45..=46 => {
                let forced = rng.below(2) == 0;
                let before = engine.pool().n_free();
                let reset = if forced {
                    engine.force_reset_prefix_cache()
                } else {
                    engine.reset_prefix_cache()
                };
                if reset.is_err() {
                    assert!(!forced, "a forced reset succeeds");
                    assert_eq!(
                        engine.pool().n_free(),
                        before,
                        "a refused reset changes nothing"
                    );
                }
            }
            47..=49 => {
                let kinds = std::env::var("KVGATE_SIM_FAULTS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(3);
                let rank = rng.below(u64::from(n_ranks)) as u32;
                let fault = match rng.below(kinds) {
                    0 => Fault::FailNext { rank },
                    1 => Fault::DelayNext {
                        rank,
                        by: Duration::from_millis(rng.below(500)),
                    },
                    _ => Fault::EvictDestination(kv_pool::PageId(1 + rng.below(60) as u32)),
                };
                engine
                    .inject_copy_fault(fault)
                    .expect("inline copies take faults");
            }
            50..=51 => {
                let to = engine.now().after(Duration::from_millis(rng.below(5000)));
                engine.advance_clock(to);
            }
            _ => {
                let report = engine.step().expect("step");
                engine.check_invariants().expect("invariants");
                for preempted in &report.preempted {
                    assert!(
                        !report.decodes.contains(preempted),
                        "a preempted request decoded in the same step"
                    );
                    assert!(
                        report.prefills.iter().all(|(id, _)| id != preempted),
                        "preempted and prefilled"
                    );
                }
            }
        }
        for finished in engine.take_finished() {
            outcome.push_str(&format!("{finished:?}\n"));
            let session = live
                .remove(&finished.id.0)
                .expect("finished a live request");
            let prompt = prompts.remove(&finished.id.0);
            if !finished.cancelled {
                let spec_prompt_len = finished.metrics.prompt_tokens as usize;
                let mut context = sessions[session].clone();
                context.truncate(spec_prompt_len.min(context.len()));
                sessions[session] = context;
                // Decided by the id, outside `rng`: an even request's session goes on from its answer.
                if let Some(prompt) = prompt.filter(|_| finished.id.0.is_multiple_of(2)) {
                    sessions[session] = [prompt, finished.output.clone()].concat();
                }
            }
        }
        // Paused streams: close them so every request ends.
        close_paused_streams(&mut engine, &mut live);
    }
    // The engine's watchdog (K3) fails a step once nothing progresses, naming the stuck requests.
    while !engine.is_idle() {
        engine.step().expect("step");
        engine.check_invariants().expect("invariants");
        close_paused_streams(&mut engine, &mut live);
    }
    for finished in engine.take_finished() {
        outcome.push_str(&format!("{finished:?}\n"));
        live.remove(&finished.id.0);
    }
    assert!(
        live.is_empty(),
        "every request finished or was cancelled: {live:?}"
    );
    assert_eq!(engine.metrics().leaked_pages, 0);
    assert_eq!(engine.pool().n_in_use(), 0, "no page held once idle");
    let metrics = engine::RunMetrics {
        wall_seconds: 0.0,
        ..engine.metrics()
    };
    outcome.push_str(&format!("{metrics:?}"));
    let hybrid_local_hits = if hybrid {
        engine
            .request_metrics()
            .iter()
            .map(|m| u64::from(m.prompt_tokens_local_hit))
            .sum()
    } else {
        0
    };
    Simulated {
        outcome,
        hybrid_local_hits,
    }
}

/// Closes every paused stream among `live` and forgets the requests that ended.
fn close_paused_streams(engine: &mut Engine, live: &mut BTreeMap<u64, usize>) {
    for &id in live.keys() {
        if engine
            .request(RequestId(id))
            .is_some_and(|view| view.phase == engine::RequestPhase::Paused)
        {
            engine
                .close_stream(RequestId(id))
                .expect("close a paused stream");
        }
    }
    for finished in engine.take_finished() {
        live.remove(&finished.id.0);
    }
}

#[test]
fn sim_random_requests_cancellations_resets_faults_and_clock_jumps_under_every_policy() {
    let env = |name: &str| -> Option<u64> {
        let value = std::env::var(name).ok()?;
        Some(
            value
                .parse()
                .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        )
    };
    // KVGATE_SIM_SEED=N reruns one seed; KVGATE_SIM_SEEDS=N runs seeds 0..N (12 by default).
    let seeds = match env("KVGATE_SIM_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..env("KVGATE_SIM_SEEDS").unwrap_or(12),
    };
    let only: Option<Policy> = std::env::var("KVGATE_SIM_POLICY")
        .ok()
        .and_then(|name| name.parse().ok());
    let mut hybrid_local_hits = 0;
    for policy in [
        Policy::Ordinary,
        Policy::PagesOnly,
        Policy::Reserved,
        Policy::Oracle,
    ] {
        if only.is_some_and(|only| only != policy) {
            continue;
        }
        for seed in seeds.clone() {
            // Odd seeds defer the prompts of half their requests (`Defer::EvenIds`).
            let defer = if seed % 2 == 1 {
                Defer::EvenIds
            } else {
                Defer::None
            };
            let result = std::panic::catch_unwind(|| simulate(policy, seed, 3000, defer));
            let Ok(simulated) = result else {
                panic!("simulation failed: policy {policy}, seed {seed} (rerun with this seed)");
            };
            hybrid_local_hits += simulated.hybrid_local_hits;
        }
    }
    // The default seeds draw hybrid models whose later turns hit a finished turn's boundary locally (H9).
    if seeds.end - seeds.start >= 12 {
        assert!(hybrid_local_hits > 0, "no hybrid local hit was drawn");
    }
}

/// W1 regression (the review's seed 1441 under `reserved`): two capacity waiters whose bounded wait ran out
/// while every copy slot was busy were never polled into expiry, so the clock froze at their expiry time.
#[test]
fn w1_capacity_waiters_expire_while_copy_slots_are_busy_sim_seed_1441() {
    let _simulated = simulate(Policy::Reserved, 1441, 3000, Defer::None);
}

/// A deferred prompt (`RequestSpec::keyed_from_source`) changes nothing the engine does: the same simulation with
/// half its prompts deferred finishes every request with the same outputs and metrics, under every policy,
/// hybrid models, preemptions, restores (verified against recompute), cancellations, resets, faults and
/// clock jumps included. `KVGATE_SIM_SEEDS=N` runs seeds `0..N / 3` (4 by default).
#[test]
fn a_deferred_prompt_changes_no_output_and_no_metric_in_the_simulation() {
    let seeds = std::env::var("KVGATE_SIM_SEEDS")
        .ok()
        .and_then(|value| value.parse::<u64>().ok())
        .map_or(4, |n| (n / 3).max(1));
    for policy in [
        Policy::Ordinary,
        Policy::PagesOnly,
        Policy::Reserved,
        Policy::Oracle,
    ] {
        for seed in 0..seeds {
            let held = simulate(policy, seed, 1500, Defer::None).outcome;
            let deferred = simulate(policy, seed, 1500, Defer::EvenIds).outcome;
            assert!(
                held == deferred,
                "policy {policy}, seed {seed}: deferring prompts changed the outcome"
            );
        }
    }
}
