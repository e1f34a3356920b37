//! Bench (issue 29, item 7): the real model served by the engine, and what a restore is worth on the
//! engine's own path. Every figure comes from requests submitted to an `Engine` on the wall clock (threaded
//! copies, the host checkpoint store): `model_prefill_tok_s` (a 512-token prompt's tokens over its
//! submit-to-first-token time), `model_decode_tok_s_batch1` and `_batch8` (output tokens over the decode
//! time of 1 and of 8 requests on the same 512-token prompt, the 7 others finding it in the prefix cache),
//! and `model_recompute_4k_s` against `model_restore_4k_s`: submit-to-first-token of a 4,096-token prompt
//! computed from nothing, then of the next turn (that prompt, 17 more tokens) once its pages left the pool
//! (the prefix cache reset), restored from the checkpoint the first run left in the host store and the 17
//! tokens computed. `ref_recompute_4k_s`,
//! `ref_restore_4k_s` and `ref_recompute_vs_restore_4k` are the same measurement on the reference model
//! (the tiny seeded transformer). Without the cached model (`cargo xtask model`) the model figures are
//! `null` and it says so. The smoke run (no `--bench`, as `cargo test` runs it) shrinks every size.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr, reads the model cache's variables and times itself"
)]

use std::sync::Arc;

use engine::{
    ClockKind, CopyEngineKind, Engine, EngineParams, Executor, Policy, ReferenceExecutor,
    RequestSpec,
};
use kvgate::model::{LoadedModel, ModelExecutor, VerifyTime};
use kvgate::{EngineConfig, RequestMetrics};
use reference_model::ReferenceConfig;

struct Sizes {
    prompt: u32,
    decode_steps: u32,
    restore: u32,
}

/// Engine parameters for `geometry`, contexts up to `max_len`: wall clock, threaded copies, a pool of
/// `pages`, the host store.
fn params(geometry: kv_pool::Geometry, pages: u32) -> EngineParams {
    let mut config = EngineConfig::default();
    config.pool.pages = pages;
    let mut params = config
        .engine_params(Policy::Reserved)
        .expect("default params");
    params.geometry = geometry;
    params.clock = ClockKind::Wall;
    params.copy_engine = CopyEngineKind::Threaded { workers: 2 };
    params.verify_restores = false;
    params
}

/// Submits `requests` (id, prompt, outputs) at once, runs them to the end, returns their metrics by id.
fn serve<E: Executor>(
    engine: &mut Engine<E>,
    requests: &[(u64, &[u32], u32, bool)],
) -> Vec<RequestMetrics> {
    for &(id, prompt, outputs, later) in requests {
        let mut spec = RequestSpec::new(id, prompt.to_vec(), outputs, engine.now());
        spec.is_later_turn = later;
        engine.submit(spec).expect("submit");
    }
    while !engine.is_idle() {
        engine.step().expect("step");
    }
    let mut done: Vec<_> = engine
        .take_finished()
        .into_iter()
        .map(|d| d.metrics)
        .collect();
    done.sort_by_key(|m| m.id);
    done
}

fn ttft_s(m: &RequestMetrics) -> f64 {
    m.first_token
        .expect("a first token")
        .since(m.arrival)
        .as_secs_f64()
}

/// (recompute, restore) submit-to-first-token seconds on a fresh engine: `prompt` from nothing, then, once
/// the prefix cache is reset, the next turn (the prompt, the first answer token and 16 new tokens) restoring
/// the checkpoint the first left in the host store.
fn restore_vs_recompute<E: Executor>(
    mut engine: Engine<E>,
    prompt: &[u32],
    what: &str,
) -> (f64, f64) {
    let cold = serve(&mut engine, &[(1, prompt, 2, false)]);
    let recompute_s = ttft_s(&cold[0]);
    // Captures reach the store after the request finished (the copy model's link): let them land.
    for _ in 0..500 {
        engine.step().expect("an idle step");
    }
    engine.reset_prefix_cache().expect("reset the prefix cache");
    let mut next = prompt.to_vec();
    next.extend(prompt.iter().take(17));
    let warm = serve(&mut engine, &[(2, &next, 2, true)]);
    assert!(
        warm[0].prompt_tokens_restored > 0,
        "{what}: nothing restored: {:?}",
        warm[0]
    );
    let restore_s = ttft_s(&warm[0]);
    eprintln!(
        "{what}: {} tokens: recompute {recompute_s:.3} s; next turn of {}: restore {restore_s:.4} s ({} \
         restored, {} computed)",
        prompt.len(),
        next.len(),
        warm[0].prompt_tokens_restored,
        warm[0].prompt_tokens_recomputed
    );
    (recompute_s, restore_s)
}

fn prompt(n: u32, vocab: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 7919 + 13) % vocab).collect()
}

fn model_figures(model: &Arc<LoadedModel>, sizes: &Sizes) -> String {
    let vocab = model.llama.config().vocab as u32;
    let executor = || ModelExecutor::new(Arc::clone(model), VerifyTime::default());
    let geometry = model.geometry(sizes.restore + 64).expect("geometry");
    let pages = 2 * (sizes.restore / 16 + 8);
    let p = prompt(sizes.prompt, vocab);
    let mut engine = Engine::builder(params(geometry.clone(), pages))
        .executor(executor())
        .build()
        .expect("engine");
    let one = serve(&mut engine, &[(1, &p, sizes.decode_steps + 1, false)]);
    let prefill = f64::from(sizes.prompt) / ttft_s(&one[0]);
    let decode_s = |m: &RequestMetrics| {
        m.finished
            .expect("finished")
            .since(m.first_token.expect("first token"))
            .as_secs_f64()
    };
    let decode_1 = f64::from(sizes.decode_steps) / decode_s(&one[0]);
    let eight: Vec<(u64, &[u32], u32, bool)> = (10..18)
        .map(|id| (id, p.as_slice(), sizes.decode_steps + 1, false))
        .collect();
    let done = serve(&mut engine, &eight);
    let start = done
        .iter()
        .filter_map(|m| m.first_token)
        .min()
        .expect("first tokens");
    let end = done.iter().filter_map(|m| m.finished).max().expect("ends");
    let decode_8 = f64::from(8 * sizes.decode_steps) / end.since(start).as_secs_f64();
    eprintln!(
        "model: prefill {prefill:.1} tok/s, decode {decode_1:.1} (batch 1), {decode_8:.1} tok/s (batch 8)"
    );
    let engine = Engine::builder(params(geometry, pages))
        .executor(executor())
        .build()
        .expect("engine");
    let (recompute, restore) = restore_vs_recompute(engine, &prompt(sizes.restore, vocab), "model");
    format!(
        "\"model_prefill_tok_s\": {prefill:.2}, \"model_decode_tok_s_batch1\": {decode_1:.2}, \
         \"model_decode_tok_s_batch8\": {decode_8:.2}, \"model_recompute_4k_s\": {recompute:.3}, \
         \"model_restore_4k_s\": {restore:.4}, \"model_recompute_vs_restore_4k\": {:.1}",
        recompute / restore
    )
}

fn reference_figures(sizes: &Sizes) -> String {
    let config = ReferenceConfig::tiny();
    let geometry = config.geometry(sizes.restore + 64).expect("geometry");
    let pages = 2 * (config.pages_for_tokens(sizes.restore) + 8);
    let executor = ReferenceExecutor::new(config).expect("the tiny model");
    let engine = Engine::builder(params(geometry, pages))
        .executor(executor)
        .build()
        .expect("engine");
    let (recompute, restore) =
        restore_vs_recompute(engine, &prompt(sizes.restore, config.vocab), "reference");
    format!(
        "\"ref_recompute_4k_s\": {recompute:.4}, \"ref_restore_4k_s\": {restore:.5}, \
         \"ref_recompute_vs_restore_4k\": {:.1}",
        recompute / restore
    )
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            prompt: 512,
            decode_steps: 32,
            restore: 4096,
        }
    } else {
        Sizes {
            prompt: 16,
            decode_steps: 2,
            restore: 48,
        }
    };
    let reference = reference_figures(&sizes);
    let dir = std::env::var_os(llama::MODEL_DIR_ENV);
    let home = std::env::var_os("HOME");
    let model = match llama::cached_model(dir.as_deref(), home.as_deref()) {
        Some(path) => {
            let model = LoadedModel::load(&path).expect("the cached model loads");
            model_figures(&model, &sizes)
        }
        None if std::env::var(llama::REQUIRE_MODEL_ENV).as_deref() == Ok("1") => {
            panic!(
                "{}=1 but no cached model: run `cargo xtask model`",
                llama::REQUIRE_MODEL_ENV
            )
        }
        None => {
            eprintln!("model bench: skipped: no cached model (run `cargo xtask model`)");
            "\"model_prefill_tok_s\": null, \"model_decode_tok_s_batch1\": null, \
             \"model_decode_tok_s_batch8\": null, \"model_recompute_4k_s\": null, \
             \"model_restore_4k_s\": null, \"model_recompute_vs_restore_4k\": null"
                .to_string()
        }
    };
    println!("{{{reference}, {model}}}");
}
