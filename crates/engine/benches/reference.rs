//! Bench (issue 11, L4): the reference model's kernels on the tiny preset, into `HostStorage`. Prefill
//! throughput (8 prompts of 512 tokens in one batch) and decode throughput at a 1,024-token context with
//! batches of 1 and 8. Prints progress on stderr and one JSON line of medians on stdout: `ref_prefill_tok_s`,
//! `ref_decode_tok_s_batch1` and `ref_decode_tok_s_batch8`. What a restore is worth (`ref_restore_4k_s`
//! against `ref_recompute_4k_s`) is measured through the engine, in `crates/kvgate/benches/model.rs`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a bench binary reports on stdout and stderr and times itself"
)]

use std::hint::black_box;
use std::time::Instant;

use kv_pool::{HostStorage, PageId};
use reference_model::{ForwardEntry, ModelStorage, ReferenceConfig, ReferenceModel};

/// Sizes of one run: the smoke run (no `--bench`) shrinks every context.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    prefill_tokens: u32,
    decode_context: u32,
    decode_steps: u32,
    chunk_tokens: u32,
    repetitions: usize,
}

/// A request's pages: `n_pages` consecutive attention pages from `first_page`, and state page `state_page`.
struct Request {
    tokens: Vec<u32>,
    pages: Vec<PageId>,
    state_pages: [PageId; 1],
}

impl Request {
    fn new(
        id: u64,
        n_tokens: u32,
        capacity: u32,
        first_page: u32,
        config: &ReferenceConfig,
    ) -> Request {
        let n_pages = config.pages_for_tokens(capacity);
        Request {
            tokens: tokens(id, n_tokens, config.vocab),
            pages: (first_page..first_page + n_pages).map(PageId).collect(),
            state_pages: [PageId(id as u32 + 1)],
        }
    }

    fn entry(&self, first_pos: u32, n: u32) -> ForwardEntry<'_> {
        ForwardEntry {
            tokens: &self.tokens[first_pos as usize..(first_pos + n) as usize],
            first_pos,
            attention_pages: &self.pages,
            local_pages: &[],
            state_pages: &self.state_pages,
            want_logits: true,
        }
    }
}

/// Distinct tokens for request `id` (splitmix64 of id and position).
fn tokens(id: u64, n: u32, vocab: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let mut x = (id << 20 ^ u64::from(i)).wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((x ^ (x >> 31)) % u64::from(vocab)) as u32
        })
        .collect()
}

struct Storages {
    attention: HostStorage,
    recurrent: HostStorage,
}

impl Storages {
    fn new(config: &ReferenceConfig, n_pages: u32) -> Storages {
        Storages {
            attention: HostStorage::new(1, n_pages, config.bytes_per_page()).expect("storage"),
            recurrent: HostStorage::new(1, 64, config.recurrent_bytes_per_page()).expect("storage"),
        }
    }

    fn view(&self) -> ModelStorage<'_> {
        ModelStorage {
            attention: &self.attention,
            local: None,
            recurrent: Some(&self.recurrent),
        }
    }
}

/// Prefills `request` from position 0 to `end` in chunks of `chunk`.
fn prefill(model: &ReferenceModel, storages: &Storages, request: &Request, end: u32, chunk: u32) {
    let mut done = 0;
    while done < end {
        let n = chunk.min(end - done);
        black_box(
            model
                .forward(storages.view(), &[request.entry(done, n)])
                .expect("forward"),
        );
        done += n;
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Prefill tokens per second: 8 prompts in one batch.
fn prefill_tok_s(model: &ReferenceModel, sizes: Sizes) -> f64 {
    let config = model.config();
    let per_request = config.pages_for_tokens(sizes.prefill_tokens);
    let samples = (0..sizes.repetitions)
        .map(|repetition| {
            let storages = Storages::new(config, 8 * per_request + 1);
            let requests: Vec<Request> = (0..8)
                .map(|id| {
                    Request::new(
                        id,
                        sizes.prefill_tokens,
                        sizes.prefill_tokens,
                        1 + id as u32 * per_request,
                        config,
                    )
                })
                .collect();
            let batch: Vec<ForwardEntry<'_>> = requests
                .iter()
                .map(|r| r.entry(0, sizes.prefill_tokens))
                .collect();
            let start = Instant::now();
            black_box(model.forward(storages.view(), &batch).expect("forward"));
            let tok_s = f64::from(8 * sizes.prefill_tokens) / start.elapsed().as_secs_f64();
            eprintln!("prefill: repetition {repetition}: {tok_s:.0} tok/s");
            tok_s
        })
        .collect();
    median(samples)
}

/// Decode tokens per second of `batch` requests at a context of `decode_context` tokens.
fn decode_tok_s(model: &ReferenceModel, sizes: Sizes, batch: u32) -> f64 {
    let config = model.config();
    let capacity = sizes.decode_context + sizes.decode_steps;
    let per_request = config.pages_for_tokens(capacity);
    let storages = Storages::new(config, batch * per_request + 1);
    let requests: Vec<Request> = (0..batch)
        .map(|id| {
            Request::new(
                u64::from(id),
                capacity,
                capacity,
                1 + id * per_request,
                config,
            )
        })
        .collect();
    let samples = (0..sizes.repetitions)
        .map(|repetition| {
            for request in &requests {
                prefill(
                    model,
                    &storages,
                    request,
                    sizes.decode_context,
                    sizes.chunk_tokens,
                );
            }
            let start = Instant::now();
            for step in 0..sizes.decode_steps {
                let entries: Vec<ForwardEntry<'_>> = requests
                    .iter()
                    .map(|r| r.entry(sizes.decode_context + step, 1))
                    .collect();
                black_box(model.forward(storages.view(), &entries).expect("forward"));
            }
            let tok_s = f64::from(batch * sizes.decode_steps) / start.elapsed().as_secs_f64();
            eprintln!("decode batch {batch}: repetition {repetition}: {tok_s:.0} tok/s");
            tok_s
        })
        .collect();
    median(samples)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) the bench is a quick smoke run.
    let smoke = !args.iter().any(|arg| arg == "--bench");
    let quick = args.iter().any(|arg| arg == "--quick");
    let sizes = if smoke {
        Sizes {
            prefill_tokens: 32,
            decode_context: 64,
            decode_steps: 4,
            chunk_tokens: 64,
            repetitions: 1,
        }
    } else {
        Sizes {
            prefill_tokens: 512,
            decode_context: 1024,
            decode_steps: 64,
            chunk_tokens: 512,
            repetitions: if quick { 3 } else { 5 },
        }
    };
    let model = ReferenceModel::new(ReferenceConfig::tiny()).expect("the tiny config is valid");
    let prefill = prefill_tok_s(&model, sizes);
    let decode_1 = decode_tok_s(&model, sizes, 1);
    let decode_8 = decode_tok_s(&model, sizes, 8);
    println!(
        "{{\"ref_prefill_tok_s\": {prefill:.0}, \"ref_decode_tok_s_batch1\": {decode_1:.0}, \
         \"ref_decode_tok_s_batch8\": {decode_8:.0}}}"
    );
}
