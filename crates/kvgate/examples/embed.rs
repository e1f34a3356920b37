//! Drives a kvgate engine step by step, the way an embedding server's scheduler thread would: submit
//! requests as they arrive, call `step` once per iteration, stream finished requests back, and build the
//! next turn of a session from the previous prompt and response so its prefix comes back from the
//! checkpoint store instead of being recomputed.
//!
//! Run it with `cargo run -p kvgate --example embed`.
#![allow(clippy::print_stdout, reason = "an example prints what it does")]

use kvgate::{EngineBuilder, EngineConfig, Policy, RequestSpec, Timestamp};

fn main() -> Result<(), kvgate::Error> {
    // A small pool (256 pages of 16 tokens) so the second turn's prefix is no longer resident.
    let mut config = EngineConfig::default();
    config.pool.pages = 256;
    let mut engine = EngineBuilder::new(config)
        .policy(Policy::Reserved)
        .build()?;

    // Turn 1 of a session: a 2 000-token prompt.
    let first_prompt: Vec<u32> = (0..2_000).map(|i| (i * 7919 % 50_000) as u32).collect();
    engine.submit(RequestSpec::new(
        1,
        first_prompt.clone(),
        32,
        Timestamp::ZERO,
    ))?;

    // A competing request that fills the pool while the session thinks.
    let other: Vec<u32> = (0..3_000)
        .map(|i| (i * 104_729 % 50_000) as u32 + 1)
        .collect();
    let mut second_turn_sent = false;
    let mut steps = 0u64;
    while !engine.is_idle() {
        let report = engine.step()?;
        steps += 1;
        for done in engine.take_finished() {
            println!(
                "request {} finished at {:.3} s with {} output tokens",
                done.id.0,
                report.now.as_secs_f64(),
                done.output.len()
            );
            if done.id.0 == 1 && !second_turn_sent {
                // The session's next turn: previous prompt + response + new input, after some think time.
                engine.submit(RequestSpec::new(2, other.clone(), 16, engine.now()))?;
                let mut prompt = first_prompt.clone();
                prompt.extend(&done.output);
                prompt.extend((0..64).map(|i| 40_000 + i));
                let mut turn = RequestSpec::new(
                    3,
                    prompt,
                    32,
                    engine.now().after(std::time::Duration::from_secs(1)),
                );
                turn.is_later_turn = true;
                engine.submit(turn)?;
                second_turn_sent = true;
            }
        }
    }
    let metrics = engine.metrics();
    println!(
        "{steps} steps, {:.1} simulated s: {} prompt tokens, {} restored from the store, {} from the local cache, {} recomputed",
        metrics.sim_seconds,
        metrics.prompt_tokens,
        metrics.prompt_tokens_restored,
        metrics.prompt_tokens_local_hit,
        metrics.prompt_tokens_recomputed
    );
    Ok(())
}
