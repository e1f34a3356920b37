//! Preemption by offload (Q6 with `Preemption::Offload`): a running request preempted for pages captures
//! what it computed into the store first, and comes back through its policy's restore path; restored pages
//! equal recompute (verified, E3), the model generates the same tokens, nothing leaks, and the report counts
//! the preempted tokens apart by where they came back from.

use engine::{
    CostModel, Engine, EngineParams, Executor, Policy, Preemption, ReferenceExecutor,
    RequestMetrics, SimExecutor,
};
use kv_pool::{CacheGroup, Geometry, GroupKind, RequestId};

use crate::agents::tokens;
use crate::contract::{TPP, spec};

/// The shapes of pressure a preemption comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pressure {
    /// Two requests whose decodes outgrow a pool of 40 usable pages: the newer one (id 2) is preempted while
    /// it decodes, and the older grows over the pages it freed.
    Decodes,
    /// A long-decoding request and a long prompt prefilled in chunks: the prompt (id 2) gives way to the
    /// decode in the middle of its prefill.
    Prefill,
}

fn submit<E: Executor>(engine: &mut Engine<E>, pressure: Pressure) {
    let (prompts, outputs) = match pressure {
        Pressure::Decodes => ([10 * TPP - 1, 10 * TPP - 1], [200, 200]),
        Pressure::Prefill => ([20 * TPP - 1, 28 * TPP - 1], [300, 4]),
    };
    for (id, (prompt, output)) in (1..).zip(prompts.into_iter().zip(outputs)) {
        let prompt = tokens(20, id as u32, 0, prompt);
        engine
            .submit(spec(id, prompt, output, engine.now()))
            .unwrap();
    }
}

/// The decode pressure, as every test but the shapes' one uses it.
fn submit_pressure<E: Executor>(engine: &mut Engine<E>) {
    submit(engine, Pressure::Decodes);
}

fn params(policy: Policy, preemption: Preemption) -> EngineParams {
    EngineParams {
        policy,
        preemption,
        n_pages: 41,
        max_running: 4,
        chunk_tokens: 64,
        ..crate::verified_defaults()
    }
}

/// Runs to idle checking the invariants after every step (`live::run`); the outputs by id, and request 2's
/// metrics.
fn run<E: Executor>(engine: &mut Engine<E>) -> (Vec<(RequestId, Vec<u32>)>, RequestMetrics) {
    let outputs = crate::live::run(engine);
    assert_eq!(engine.metrics().leaked_pages, 0, "no page leaks");
    let victim = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(2)))
        .cloned()
        .expect("request 2 ran");
    (outputs, victim)
}

/// A full-attention group and a recurrent group: a hybrid request is captured at its exact boundary.
fn hybrid(params: EngineParams) -> EngineParams {
    let bytes_per_page = params.geometry.groups()[0].bytes_per_page;
    let groups = vec![
        CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page,
        },
        CacheGroup {
            kind: GroupKind::Recurrent,
            bytes_per_page,
        },
    ];
    EngineParams {
        geometry: Geometry::new(groups, TPP, 1, params.geometry.max_model_len()).unwrap(),
        ..params
    }
}

#[test]
fn q6_an_offloaded_preemption_restores_what_it_computed_and_counts_it_apart_under_every_policy() {
    for pressure in [Pressure::Decodes, Pressure::Prefill] {
        for with_state in [false, true] {
            for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
                let case = format!("{policy} {pressure:?} (recurrent state {with_state})");
                let build = |preemption| {
                    let params = params(policy, preemption);
                    Engine::new(if with_state { hybrid(params) } else { params }).unwrap()
                };
                let mut offloaded = build(Preemption::Offload);
                submit(&mut offloaded, pressure);
                let (outputs, victim) = run(&mut offloaded);
                let mut recomputed = build(Preemption::Recompute);
                submit(&mut recomputed, pressure);
                let (outputs_recompute, victim_recompute) = run(&mut recomputed);
                check_offload(&case, &offloaded, &victim, &victim_recompute);
                if pressure == Pressure::Prefill {
                    let computed = victim.preempted_tokens_local_hit
                        + victim.preempted_tokens_restored
                        + victim.preempted_tokens_recomputed;
                    assert!(
                        computed < victim.prompt_tokens * victim.preemptions,
                        "{case}: preempted before its prompt was computed: {victim:?}"
                    );
                }
                assert_eq!(outputs, outputs_recompute, "{case}: the same tokens");
                if policy == Policy::Reserved {
                    // What it computed came back from the store (restored pages verified, E3), not from
                    // a recompute.
                    assert!(offloaded.pages_verified() > 0, "{case}: restores verified");
                    assert!(
                        victim.preempted_tokens_recomputed
                            < victim_recompute.preempted_tokens_recomputed,
                        "{case}: offloaded {victim:?}, recomputed {victim_recompute:?}"
                    );
                }
            }
        }
    }
}

/// What holds under every policy: the victim was preempted, each of its preemptions offloaded (copying out
/// and back is far cheaper than recomputing here) and counted in the run, none without offload, and each
/// preempted token accounted for. Not that offload recomputes less: `ordinary` may find the longer offloaded
/// checkpoint, fail to get its pages at once and recompute it all, where a shorter one would have fit.
fn check_offload(
    case: &str,
    offloaded: &Engine,
    victim: &RequestMetrics,
    victim_recompute: &RequestMetrics,
) {
    assert!(
        victim.preemptions > 0,
        "{case}: the pool forces a preemption: {victim:?}"
    );
    assert_eq!(
        victim.preemptions_offloaded, victim.preemptions,
        "{case}: {victim:?}"
    );
    assert_eq!(victim_recompute.preemptions_offloaded, 0, "{case}");
    let run = offloaded.metrics();
    assert_eq!(run.preemptions_offloaded, run.preemptions, "{case}");
    for metrics in [victim, victim_recompute] {
        let accounted = metrics.preempted_tokens_local_hit
            + metrics.preempted_tokens_restored
            + metrics.preempted_tokens_recomputed;
        assert!(accounted >= 2 * TPP, "{case}: {metrics:?}");
    }
}

#[test]
fn q6_a_preemption_is_not_offloaded_when_copying_costs_more_than_recomputing() {
    // Copies at 1 KB/s: out and back costs hours; recomputing 200 tokens, milliseconds.
    let cost = CostModel {
        copy_bytes_per_s: 1e3,
        ..CostModel::small_8b_gpu()
    };
    let mut engine = Engine::builder(EngineParams {
        cost: cost.clone(),
        ..params(Policy::Reserved, Preemption::Offload)
    })
    .executor(SimExecutor::new(cost))
    .build()
    .unwrap();
    submit_pressure(&mut engine);
    let (_outputs, victim) = run(&mut engine);
    assert!(victim.preemptions > 0);
    assert_eq!(victim.preemptions_offloaded, 0, "{victim:?}");
}

#[test]
fn q6_an_offloaded_preemption_generates_the_reference_models_tokens() {
    let config = reference_model::ReferenceConfig {
        seed: 5,
        ..reference_model::ReferenceConfig::tiny()
    };
    let outputs = [Preemption::Offload, Preemption::Recompute].map(|preemption| {
        let executor = ReferenceExecutor::new(config).unwrap();
        let params = EngineParams {
            geometry: Geometry::new(config.cache_groups(), config.tokens_per_page, 1, 4096)
                .unwrap(),
            chunk_tokens: 48,
            max_batched_tokens: 96,
            ..params(Policy::Reserved, preemption)
        };
        let mut engine = Engine::builder(params).executor(executor).build().unwrap();
        submit_pressure(&mut engine);
        let (outputs, victim) = run(&mut engine);
        assert!(victim.preemptions > 0, "{preemption:?}");
        if preemption == Preemption::Offload {
            assert!(victim.preempted_tokens_restored > 0, "{victim:?}");
            assert!(engine.pages_verified() > 0);
        }
        outputs
    });
    assert_eq!(
        outputs[0], outputs[1],
        "restore == recompute after an offloaded preemption"
    );
}
