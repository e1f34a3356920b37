//! Bench (issue 29, item 3): the real model, SmolLM2-135M-Instruct Q4_1, on plain contiguous KV. Prefill
//! throughput (a 512-token prompt in chunks of 128) and decode throughput at a 512-token context with
//! batches of 1 and 8 sequences (each step one token per sequence). Prints progress on stderr and one JSON
//! line of medians on stdout: `llama_prefill_tok_s`, `llama_decode_tok_s_batch1`,
//! `llama_decode_tok_s_batch8`, with the thread count. Without the cached model (`cargo xtask model`) it
//! says so and prints `{}`; the smoke run (no `--bench`, as `cargo test` runs it) shrinks every size.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr, reads the model cache's variables and times itself"
)]

use std::time::Instant;

use llama::{ContiguousKv, Entry, Llama, MODEL_DIR_ENV, REQUIRE_MODEL_ENV, argmax};

struct Sizes {
    context: usize,
    chunk: usize,
    steps: usize,
    repetitions: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            context: 512,
            chunk: 128,
            steps: 32,
            repetitions: 3,
        }
    } else {
        Sizes {
            context: 8,
            chunk: 4,
            steps: 2,
            repetitions: 1,
        }
    };
    let dir = std::env::var_os(MODEL_DIR_ENV);
    let home = std::env::var_os("HOME");
    let Some(path) = llama::cached_model(dir.as_deref(), home.as_deref()) else {
        if std::env::var(REQUIRE_MODEL_ENV).as_deref() == Ok("1") {
            panic!("{REQUIRE_MODEL_ENV}=1 but the model is not cached: run `cargo xtask model`");
        }
        eprintln!("llama bench: skipped: no cached model (run `cargo xtask model`)");
        println!("{{}}");
        return;
    };
    let model = Llama::load(&path).expect("the cached model loads");
    let c = model.config().clone();
    let threads = rayon::current_num_threads();
    let prompt: Vec<u32> = (0..sizes.context as u32)
        .map(|i| 1000 + (i * 7919) % 40_000)
        .collect();
    let capacity = sizes.context + sizes.steps + 1;

    let mut prefill = Vec::new();
    let mut primed = None;
    for _ in 0..sizes.repetitions {
        let mut kv = ContiguousKv::new(c.layers, c.kv_dim(), capacity);
        let start = Instant::now();
        let mut logits = None;
        for piece in prompt.chunks(sizes.chunk) {
            let mut batch = [Entry {
                tokens: piece,
                kv: &mut kv,
                want_logits: true,
            }];
            logits = model.forward(&mut batch).expect("prefill").pop().flatten();
        }
        prefill.push(sizes.context as f64 / start.elapsed().as_secs_f64());
        primed = Some((kv, argmax(&logits.expect("logits")).expect("a token")));
    }
    let (kv, first) = primed.expect("at least one repetition");
    eprintln!(
        "llama bench: prefill {:.1} tok/s ({} tokens, chunks of {}, {threads} threads)",
        median(&mut prefill),
        sizes.context,
        sizes.chunk
    );

    let decode = |batch_size: usize| -> f64 {
        let mut rates = Vec::new();
        for _ in 0..sizes.repetitions {
            let mut stores: Vec<ContiguousKv> = (0..batch_size).map(|_| kv.clone()).collect();
            let mut next = vec![first; batch_size];
            let start = Instant::now();
            for _ in 0..sizes.steps {
                let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let mut batch: Vec<Entry<'_>> = stores
                    .iter_mut()
                    .zip(&tokens)
                    .map(|(kv, t)| Entry {
                        tokens: t,
                        kv,
                        want_logits: true,
                    })
                    .collect();
                let out = model.forward(&mut batch).expect("decode");
                for (n, logits) in next.iter_mut().zip(out) {
                    *n = argmax(&logits.expect("logits")).expect("a token");
                }
            }
            rates.push((sizes.steps * batch_size) as f64 / start.elapsed().as_secs_f64());
        }
        let rate = median(&mut rates);
        eprintln!(
            "llama bench: decode batch {batch_size}: {rate:.1} tok/s at context {}",
            sizes.context
        );
        rate
    };
    let batch1 = decode(1);
    let batch8 = decode(8);
    println!(
        "{{\"llama_prefill_tok_s\": {:.2}, \"llama_decode_tok_s_batch1\": {batch1:.2}, \
         \"llama_decode_tok_s_batch8\": {batch8:.2}, \"llama_threads\": {threads}}}",
        median(&mut prefill)
    );
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
