//! Bench (issue 29, item 3; issue 30, item 6): the real model, SmolLM2-135M-Instruct Q4_1, on plain
//! contiguous KV. Prefill throughput (a 512-token prompt in chunks of 128) and decode throughput at a
//! 512-token context with batches of 1 and 8 sequences (each step one token per sequence), each per second
//! of wall time and per second of the process's CPU time (user + system, all threads; Linux only, from
//! `/proc/self/stat`, 10 ms ticks, so the figure is absent elsewhere). Prints progress on stderr and one JSON
//! line of medians on stdout: `llama_prefill_tok_s`, `llama_decode_tok_s_batch1`,
//! `llama_decode_tok_s_batch8`, their `_per_cpu_s` twins (`llama_prefill_tok_per_cpu_s`, ...), and the
//! thread count. Without the cached model (`cargo xtask model`) it says so and prints `{}`; the smoke run
//! (no `--bench`, as `cargo test` runs it) shrinks every size.
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

/// Tokens per wall second and per CPU second (`None` when the CPU time is unknown) of one timed run.
#[derive(Clone, Copy)]
struct Rate {
    wall: f64,
    cpu: Option<f64>,
}

/// A stopwatch of wall and process CPU time.
struct Clock {
    wall: Instant,
    cpu: Option<f64>,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            wall: Instant::now(),
            cpu: cpu_seconds(),
        }
    }

    fn rate(&self, tokens: usize) -> Rate {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = match (self.cpu, cpu_seconds()) {
            (Some(start), Some(end)) if end > start => Some(tokens as f64 / (end - start)),
            _ => None,
        };
        Rate {
            wall: tokens as f64 / wall,
            cpu,
        }
    }
}

/// The process's user + system CPU seconds so far (all threads), from `/proc/self/stat` (fields 14 and
/// 15, in the kernel's fixed 100 Hz user ticks); `None` where there is no such file.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count fields after its `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
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
        let clock = Clock::start();
        let mut logits = None;
        for piece in prompt.chunks(sizes.chunk) {
            let mut batch = [Entry {
                tokens: piece,
                kv: &mut kv,
                want_logits: true,
            }];
            logits = model.forward(&mut batch).expect("prefill").pop().flatten();
        }
        prefill.push(clock.rate(sizes.context));
        primed = Some((kv, argmax(&logits.expect("logits")).expect("a token")));
    }
    let (kv, first) = primed.expect("at least one repetition");
    let prefill = median(&prefill);
    eprintln!(
        "llama bench: prefill {} ({} tokens, chunks of {}, {threads} threads)",
        describe(prefill),
        sizes.context,
        sizes.chunk
    );

    let decode = |batch_size: usize| -> Rate {
        let mut rates = Vec::new();
        for _ in 0..sizes.repetitions {
            let mut stores: Vec<ContiguousKv> = (0..batch_size).map(|_| kv.clone()).collect();
            let mut next = vec![first; batch_size];
            let clock = Clock::start();
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
            rates.push(clock.rate(sizes.steps * batch_size));
        }
        let rate = median(&rates);
        eprintln!(
            "llama bench: decode batch {batch_size}: {} at context {}",
            describe(rate),
            sizes.context
        );
        rate
    };
    let batch1 = decode(1);
    let batch8 = decode(8);
    let mut figures = vec![
        format!("\"llama_prefill_tok_s\": {:.2}", prefill.wall),
        format!("\"llama_decode_tok_s_batch1\": {:.2}", batch1.wall),
        format!("\"llama_decode_tok_s_batch8\": {:.2}", batch8.wall),
    ];
    for (name, rate) in [
        ("llama_prefill_tok_per_cpu_s", prefill),
        ("llama_decode_tok_per_cpu_s_batch1", batch1),
        ("llama_decode_tok_per_cpu_s_batch8", batch8),
    ] {
        if let Some(cpu) = rate.cpu {
            figures.push(format!("\"{name}\": {cpu:.2}"));
        }
    }
    figures.push(format!("\"llama_threads\": {threads}"));
    println!("{{{}}}", figures.join(", "));
}

fn describe(rate: Rate) -> String {
    match rate.cpu {
        Some(cpu) => format!("{:.1} tok/s, {cpu:.1} tok per CPU second", rate.wall),
        None => format!("{:.1} tok/s", rate.wall),
    }
}

/// The median run by wall rate, and the median CPU rate of the runs that have one.
fn median(rates: &[Rate]) -> Rate {
    let mut wall: Vec<f64> = rates.iter().map(|r| r.wall).collect();
    let mut cpu: Vec<f64> = rates.iter().filter_map(|r| r.cpu).collect();
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    Rate {
        wall: wall[wall.len() / 2],
        cpu: cpu.get(cpu.len() / 2).copied(),
    }
}
