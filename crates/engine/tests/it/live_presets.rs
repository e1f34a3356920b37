//! L4 across the model presets: the reference model in the shape of each preset of
//! `crates/kvgate/src/config/presets.rs`, scaled down (a 64-wide model, small windows, a few pages), restores
//! turn 2 of a session from the store with every page verified against a recompute on every rank (E3: the
//! full-attention blocks, the live window pages, every recurrent state page), and generates the tokens a
//! fresh engine that recomputes everything generates, and those of the model run alone, under every policy;
//! a corrupted copy on the second rank is caught (L5).

use checkpoint_transfer::Fault;
use engine::{Engine, EngineParams, Error, Policy, ReferenceExecutor, RequestSpec};
use kv_pool::{GroupKind, HostStorage, PageId, PageStorage, RequestId};
use reference_model::{
    ForwardEntry, LocalAttention, ModelStorage, ReferenceConfig, ReferenceModel,
};

use crate::agents::tokens;
use crate::contract::spec;
use crate::live::{run, try_run};

/// Longest context of these engines.
const MAX_MODEL_LEN: u32 = 4096;

/// A preset's shape on the reference model, scaled down.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// The preset it scales down (or the group kind it adds).
    name: &'static str,
    model: ReferenceConfig,
    draft_tokens: u32,
}

/// The presets' shapes: `glm-mla-hybrid` (one full-attention group, three recurrent groups, two
/// context-parallel ranks, three draft tokens; 16-token pages where the preset has 64), `linear-hybrid` (a
/// full-attention layer and a recurrent group of three layers), `sliding-window` (a full-attention layer and
/// two sliding-window layers of a 40-token window where the preset has 1024), and chunked-local attention
/// beside full attention and a recurrent group (no preset has it; the model runs it).
fn shapes() -> [Shape; 4] {
    let tiny = ReferenceConfig {
        seed: 17,
        ..ReferenceConfig::tiny()
    };
    [
        Shape {
            name: "glm-mla-hybrid",
            model: ReferenceConfig {
                n_recurrent_groups: 3,
                context_parallel: 2,
                ..tiny
            },
            draft_tokens: 3,
        },
        Shape {
            name: "linear-hybrid",
            model: ReferenceConfig {
                n_attention_layers: 1,
                n_recurrent_layers: 3,
                ..tiny
            },
            draft_tokens: 0,
        },
        Shape {
            name: "sliding-window",
            model: ReferenceConfig {
                n_attention_layers: 1,
                local: Some(LocalAttention {
                    n_layers: 2,
                    window: GroupKind::SlidingWindow {
                        window_tokens: 40,
                        retained_tail_tokens: 0,
                    },
                }),
                n_recurrent_layers: 0,
                ..tiny
            },
            draft_tokens: 0,
        },
        Shape {
            name: "chunked-local",
            model: ReferenceConfig {
                n_attention_layers: 1,
                local: Some(LocalAttention {
                    n_layers: 1,
                    window: GroupKind::ChunkedLocal { chunk_tokens: 32 },
                }),
                ..tiny
            },
            draft_tokens: 0,
        },
    ]
}

/// `policy` on the shape's geometry, small chunks, verifying every restore (E3, L5).
fn shape_params(policy: Policy, shape: &Shape) -> EngineParams {
    EngineParams {
        geometry: shape
            .model
            .geometry(MAX_MODEL_LEN)
            .expect("the shape's geometry is valid"),
        draft_tokens: shape.draft_tokens,
        policy,
        n_pages: 257,
        max_running: 4,
        chunk_tokens: 48,
        max_batched_tokens: 96,
        verify_restores: true,
        ..crate::verified_defaults()
    }
}

fn shape_engine(policy: Policy, shape: &Shape) -> Engine<ReferenceExecutor> {
    let executor = ReferenceExecutor::new(shape.model).expect("the shape's model builds");
    Engine::builder(shape_params(policy, shape))
        .executor(executor)
        .build()
        .expect("the engine builds")
}

/// Greedy decoding of `prompt` by the model alone, in contiguous page tables on every rank: `n` tokens.
fn greedy_alone(config: ReferenceConfig, prompt: &[u32], n: usize) -> Vec<u32> {
    let model = ReferenceModel::new(config).expect("valid");
    let n_pages = 64;
    let storage =
        |bytes| HostStorage::new(config.context_parallel, n_pages, bytes).expect("storage");
    let attention = storage(config.bytes_per_page());
    let local = config.local.map(|_| storage(config.local_bytes_per_page()));
    let recurrent =
        (config.n_recurrent_layers > 0).then(|| storage(config.recurrent_bytes_per_page()));
    let storages = ModelStorage {
        attention: &attention,
        local: local.as_ref().map(|s| s as &dyn PageStorage),
        recurrent: recurrent.as_ref().map(|s| s as &dyn PageStorage),
    };
    let table: Vec<PageId> = (1..n_pages).map(PageId).collect();
    let states: Vec<PageId> = (1..=config.n_state_pages() as u32).map(PageId).collect();
    let mut input: Vec<u32> = prompt.iter().map(|t| t % config.vocab).collect();
    let mut first_pos = 0u32;
    let mut output = Vec::new();
    while output.len() < n {
        let entry = ForwardEntry {
            tokens: &input,
            first_pos,
            attention_pages: &table,
            local_pages: if local.is_some() { &table } else { &[] },
            state_pages: &states,
            want_logits: true,
        };
        let logits = model.forward(storages, &[entry]).expect("forward");
        let next = logits[0].as_ref().expect("logits asked for").next_token;
        first_pos += input.len() as u32;
        output.push(next);
        input = vec![next];
    }
    output
}

/// What one session of two turns gives under a policy.
struct Outcome {
    /// Turn 2's prompt.
    turn2: Vec<u32>,
    /// Turn 2's prompt tokens restored from the store.
    restored_tokens: u32,
    /// Pages (on every rank) verified against a recompute.
    verified: u64,
    /// Turn 2's output after the restore and on a fresh engine that recomputes it all.
    after_restore: Vec<u32>,
    after_recompute: Vec<u32>,
}

/// Turn 1 of a session, then (after a prefix-cache reset, so only the store can serve it) turn 2 restored
/// from turn 1's checkpoint with every page verified against a recompute; the same turn 2 on a fresh engine
/// recomputes it all.
fn restore_and_recompute(policy: Policy, shape: &Shape) -> Outcome {
    let mut engine = shape_engine(policy, shape);
    let prompt = tokens(5, 0, 0, 150);
    engine
        .submit(spec(1, prompt.clone(), 5, engine.now()))
        .expect("turn 1");
    let first = run(&mut engine);
    engine.reset_prefix_cache().expect("nothing staged");
    let turn2 = [prompt, first[0].1.clone(), tokens(5, 0, 1, 20)].concat();
    let mut later = spec(2, turn2.clone(), 8, engine.now());
    later.is_later_turn = true;
    engine.submit(later.clone()).expect("turn 2");
    let restored = run(&mut engine);
    let restored_tokens = engine
        .request_metrics()
        .iter()
        .find(|m| m.id == Some(RequestId(2)))
        .expect("turn 2's metrics")
        .prompt_tokens_restored;
    let verified = engine.pages_verified();
    assert_eq!(engine.metrics().leaked_pages, 0, "{}", shape.name);
    let mut fresh = shape_engine(policy, shape);
    fresh
        .submit(RequestSpec {
            arrival: fresh.now(),
            ..later
        })
        .expect("turn 2 fresh");
    let recomputed = run(&mut fresh);
    Outcome {
        turn2,
        restored_tokens,
        verified,
        after_restore: restored[0].1.clone(),
        after_recompute: recomputed[0].1.clone(),
    }
}

#[test]
fn l4_every_preset_shape_restores_kv_windows_and_states_equal_to_recompute_under_every_policy() {
    for shape in shapes() {
        let geometry = shape
            .model
            .geometry(MAX_MODEL_LEN)
            .expect("the shape's geometry is valid");
        let mut alone = None;
        for policy in Policy::ALL {
            let outcome = restore_and_recompute(policy, &shape);
            let case = format!("{} under {}", shape.name, policy.name());
            // Turn 1's checkpoint covers its prompt (150 tokens) at least.
            assert!(
                outcome.restored_tokens >= 150,
                "{case}: restored {} tokens",
                outcome.restored_tokens
            );
            // Every page of the checkpoint (its blocks, the partial last one included, the live window
            // pages and every state page) matched a recompute byte for byte on every rank.
            let checkpoint_pages = geometry.checkpoint_pages(outcome.restored_tokens);
            let expected = u64::from(checkpoint_pages * geometry.context_parallel());
            assert!(
                outcome.verified >= expected,
                "{case}: {} pages verified, a checkpoint of {} tokens holds {expected}",
                outcome.verified,
                outcome.restored_tokens
            );
            assert_eq!(
                outcome.after_restore, outcome.after_recompute,
                "{case}: model-output equivalence"
            );
            let alone = alone.get_or_insert_with(|| {
                greedy_alone(shape.model, &outcome.turn2, outcome.after_restore.len())
            });
            assert_eq!(&outcome.after_restore, alone, "{case}: the model alone");
        }
    }
}

#[test]
fn l5_a_corrupted_copy_on_the_second_rank_is_caught_by_verification() {
    let shape = shapes()[0];
    assert_eq!(shape.model.context_parallel, 2);
    let mut engine = shape_engine(Policy::Reserved, &shape);
    let prompt = tokens(9, 0, 0, 120);
    engine
        .submit(spec(1, prompt.clone(), 3, engine.now()))
        .expect("turn 1");
    let first = run(&mut engine);
    engine.reset_prefix_cache().expect("nothing staged");
    engine
        .inject_copy_fault(Fault::CorruptNext { rank: 1, byte: 7 })
        .expect("a fault to inject");
    let mut later = spec(
        2,
        [prompt, first[0].1.clone(), vec![1, 2, 3]].concat(),
        2,
        engine.now(),
    );
    later.is_later_turn = true;
    engine.submit(later).expect("turn 2");
    let error = crate::first_error(&mut engine, "the corruption");
    match error {
        Error::RestoreMismatch {
            request,
            rank,
            byte,
            ..
        } => assert_eq!((request, rank, byte), (RequestId(2), 1, 7)),
        other => panic!("expected a restore mismatch, got {other}"),
    }
}

#[test]
fn l4_a_chunked_local_block_restored_at_a_chunk_boundary_inside_it_restores_again_equal_to_recompute()
 {
    // 24-token chunks, 16-token blocks: turn 2 restores at 168, a chunk boundary inside block 10, so block 10
    // comes fresh from the pool with nothing live in it; turn 3 restores a checkpoint inside the same chunk,
    // block 10 included, whose bytes before 168 must be what a recompute writes (zeros: no query reads them).
    let shape = Shape {
        name: "chunked-local, 24-token chunks",
        model: ReferenceConfig {
            n_attention_layers: 1,
            local: Some(LocalAttention {
                n_layers: 1,
                window: GroupKind::ChunkedLocal { chunk_tokens: 24 },
            }),
            n_recurrent_layers: 0,
            seed: 17,
            ..ReferenceConfig::tiny()
        },
        draft_tokens: 0,
    };
    for policy in Policy::ALL {
        let case = format!("{} under {}", shape.name, policy.name());
        let mut engine = shape_engine(policy, &shape);
        let prompt = tokens(5, 0, 0, 164);
        engine
            .submit(spec(1, prompt.clone(), 5, engine.now()))
            .expect("turn 1");
        let first = try_run(&mut engine).expect("turn 1 runs");
        let mut turn = [prompt, first[0].1.clone()].concat();
        let mut outputs = Vec::new();
        for id in [2, 3] {
            engine.reset_prefix_cache().expect("nothing staged");
            turn.extend(tokens(5, 0, id as u32, 20));
            let mut later = spec(id, turn.clone(), 8, engine.now());
            later.is_later_turn = true;
            engine.submit(later.clone()).expect("a later turn");
            let restored = try_run(&mut engine).unwrap_or_else(|error| panic!("{case}: {error}"));
            let mut fresh = shape_engine(policy, &shape);
            fresh
                .submit(RequestSpec {
                    arrival: fresh.now(),
                    ..later
                })
                .expect("the turn, fresh");
            assert_eq!(
                restored[0].1,
                try_run(&mut fresh).expect("fresh")[0].1,
                "{case}: turn {id}"
            );
            outputs.push(restored[0].1.clone());
        }
        let restored: Vec<u32> = engine
            .request_metrics()
            .iter()
            .map(|m| m.prompt_tokens_restored)
            .collect();
        assert_eq!(restored[1], 168, "{case}: {restored:?}");
        assert!((169..192).contains(&restored[2]), "{case}: {restored:?}");
        assert!(engine.pages_verified() > 0, "{case}");
    }
}
