//! Restores of the matching blocks of a longer checkpoint (the engine's layout is attention-only: one
//! full-attention group): a request that shares only the first blocks of a stored checkpoint restores those
//! blocks under every policy, byte-identical to recompute (G2, E3), and a failed copy retries a shorter
//! prefix within the lookup budget (O7). That a layout with a recurrent or auxiliary group restores whole
//! checkpoints only is pinned in checkpoint-transfer's store tests: the engine accepts one full-attention
//! group only.

use checkpoint_transfer::{Fault, RESTORE_LOOKUPS_MAX};
use engine::{Engine, EngineParams, FallbackReason, Policy};

use crate::agents::tokens;
use crate::contract::{TPP, metrics_of, params, seed_checkpoint, spec};

/// A request sharing the first `shared_blocks` blocks of an earlier 8-block prompt, then other tokens up to
/// 9 blocks and 3 tokens, as the next turn of a conversation whose last block was partial.
fn diverging_turn(earlier: &[u32], shared_blocks: u32) -> Vec<u32> {
    let shared = &earlier[..(shared_blocks * TPP) as usize];
    let rest = tokens(2, 0, 1, (9 - shared_blocks) * TPP + 3);
    [shared, &rest[..]].concat()
}

#[test]
fn g2_prefix_of_a_longer_checkpoint_is_restored_for_attention_only_layouts() {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let params = EngineParams {
            verify_restores: true,
            ..params(policy, 129)
        };
        let mut engine = Engine::new(params).unwrap();
        let earlier = tokens(1, 0, 0, 8 * TPP);
        seed_checkpoint(&mut engine, 1, &earlier, 1);
        let verified_before = engine.pages_verified();
        // No stored checkpoint is a whole prefix of it: before block-prefix matching it recomputed.
        let mut turn = spec(2, diverging_turn(&earlier, 5), 4, engine.now());
        turn.is_later_turn = true;
        engine.submit(turn).unwrap();
        let _steps = engine.run_until_idle(100_000).expect("run");
        engine.check_invariants().expect("invariants");
        let metrics = metrics_of(&engine, 2);
        assert!(metrics.restored, "{policy}: {metrics:?}");
        assert_eq!(metrics.fallback, None, "{policy}");
        assert_eq!(metrics.prompt_tokens_restored, 5 * TPP, "{policy}");
        // E3: every restored page equals what recomputing its prefix writes.
        assert!(
            engine.pages_verified() >= verified_before + 5,
            "{policy}: restored pages verified"
        );
        assert_eq!(engine.metrics().leaked_pages, 0, "{policy}");
    }
}

#[test]
fn o7_failed_copy_retries_a_shorter_prefix_of_the_checkpoint() {
    let params = EngineParams {
        verify_restores: true,
        ..params(Policy::Reserved, 129)
    };
    let mut engine = Engine::new(params).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    engine
        .inject_copy_fault(Fault::FailNext { rank: 0 })
        .expect("inline copies take faults");
    let mut turn = spec(2, [prompt, vec![7; 8]].concat(), 4, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    let metrics = metrics_of(&engine, 2);
    assert!(metrics.restored, "{metrics:?}");
    assert_eq!(
        metrics.prompt_tokens_restored,
        7 * TPP,
        "the retry restores one block less"
    );
    assert_eq!(metrics.fallback, None);
}

#[test]
fn o7_failed_copies_stop_after_the_lookup_budget_and_recompute() {
    let mut engine = Engine::new(params(Policy::Reserved, 129)).unwrap();
    let prompt = tokens(1, 0, 0, 8 * TPP);
    seed_checkpoint(&mut engine, 1, &prompt, 1);
    for _ in 0..RESTORE_LOOKUPS_MAX {
        engine
            .inject_copy_fault(Fault::FailNext { rank: 0 })
            .expect("inline copies take faults");
    }
    let mut turn = spec(2, [prompt, vec![7; 8]].concat(), 4, engine.now());
    turn.is_later_turn = true;
    engine.submit(turn).unwrap();
    let _steps = engine.run_until_idle(10_000).expect("run");
    let metrics = metrics_of(&engine, 2);
    assert!(!metrics.restored, "{metrics:?}");
    assert_eq!(metrics.fallback, Some(FallbackReason::CopyFailed));
    assert_eq!(metrics.prompt_tokens_restored, 0);
    assert_eq!(engine.metrics().leaked_pages, 0);
}
