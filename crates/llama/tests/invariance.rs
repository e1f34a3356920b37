//! Batch invariance (issue 29, item 3) on a tiny seeded model: the bits of every KV entry and logit do not
//! depend on batch composition, on how a prompt is split into passes, or on the thread count.

mod common;

use common::writer::{Rng, VOCAB, tiny_llama};
use llama::{ContiguousKv, Entry, KvStore, Llama};

fn model() -> Llama {
    Llama::from_bytes(&tiny_llama(3).bytes()).expect("the tiny model loads")
}

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = Rng(seed);
    (0..len)
        .map(|_| (rng.next() % VOCAB as u64) as u32)
        .collect()
}

fn store(model: &Llama) -> ContiguousKv {
    let c = model.config();
    ContiguousKv::new(c.layers, c.kv_dim(), 128)
}

/// Runs `tokens` alone in passes of `chunk`, then `decode` tokens one at a time; the bits of the store and
/// of every logit vector.
fn run_alone(
    model: &Llama,
    tokens: &[u32],
    chunk: usize,
    decode: &[u32],
) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut kv = store(model);
    let mut logits = Vec::new();
    for piece in tokens.chunks(chunk) {
        let out = model
            .forward(&mut [Entry {
                tokens: piece,
                kv: &mut kv,
                want_logits: true,
            }])
            .unwrap();
        logits.push(bits(out[0].as_ref().unwrap()));
    }
    // Only the last pass's logits are comparable across chunkings.
    let mut logits = vec![logits.pop().unwrap()];
    for &t in decode {
        let out = model
            .forward(&mut [Entry {
                tokens: &[t],
                kv: &mut kv,
                want_logits: true,
            }])
            .unwrap();
        logits.push(bits(out[0].as_ref().unwrap()));
    }
    (kv.bits(), logits)
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn chunking_does_not_change_a_bit() {
    let model = model();
    let tokens = prompt(1, 45);
    let decode = prompt(2, 5);
    let whole = run_alone(&model, &tokens, tokens.len(), &decode);
    for chunk in [1, 7, 16, 32] {
        assert!(
            run_alone(&model, &tokens, chunk, &decode) == whole,
            "chunk {chunk}"
        );
    }
}

#[test]
fn batch_composition_does_not_change_a_bit() {
    let model = model();
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(10 + i, 3 + 9 * i as usize)).collect();
    let decode = prompt(20, 4);
    let alone: Vec<_> = prompts
        .iter()
        .map(|p| run_alone(&model, p, p.len(), &decode))
        .collect();
    // All five prefilled in one batch (one of them not asking for logits), then decoded together.
    let mut stores: Vec<ContiguousKv> = prompts.iter().map(|_| store(&model)).collect();
    let mut batch: Vec<Entry<'_>> = prompts
        .iter()
        .zip(stores.iter_mut())
        .map(|(p, kv)| Entry {
            tokens: p,
            kv,
            want_logits: true,
        })
        .collect();
    let mut logits: Vec<Vec<Vec<u32>>> = model
        .forward(&mut batch)
        .unwrap()
        .iter()
        .map(|l| vec![bits(l.as_ref().unwrap())])
        .collect();
    drop(batch);
    for &t in &decode {
        let tokens = [t];
        let mut batch: Vec<Entry<'_>> = stores
            .iter_mut()
            .map(|kv| Entry {
                tokens: &tokens,
                kv,
                want_logits: true,
            })
            .collect();
        for (l, out) in logits.iter_mut().zip(model.forward(&mut batch).unwrap()) {
            l.push(bits(&out.unwrap()));
        }
    }
    for (i, ((kv, l), (kv_alone, l_alone))) in stores.iter().zip(&logits).zip(&alone).enumerate() {
        assert!(kv.bits() == *kv_alone, "KV of sequence {i}");
        assert!(l == l_alone, "logits of sequence {i}");
    }
    // A prefill batched with a decode of another sequence.
    let mut a = store(&model);
    let mut b = store(&model);
    model
        .forward(&mut [Entry {
            tokens: &prompts[1],
            kv: &mut a,
            want_logits: false,
        }])
        .unwrap();
    let out = model
        .forward(&mut [
            Entry {
                tokens: &decode[..1],
                kv: &mut a,
                want_logits: true,
            },
            Entry {
                tokens: &prompts[4],
                kv: &mut b,
                want_logits: true,
            },
        ])
        .unwrap();
    assert_eq!(bits(out[0].as_ref().unwrap()), alone[1].1[1]);
    assert_eq!(bits(out[1].as_ref().unwrap()), alone[4].1[0]);
}

#[test]
fn thread_count_does_not_change_a_bit() {
    let model = model();
    let tokens = prompt(5, 60);
    let decode = prompt(6, 3);
    let runs: Vec<_> = [1, 2, 3]
        .into_iter()
        .map(|threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| run_alone(&model, &tokens, 16, &decode))
        })
        .collect();
    assert!(runs[0] == runs[1] && runs[1] == runs[2]);
}

#[test]
fn bad_entries_are_errors_before_any_write() {
    let model = model();
    let mut a = store(&model);
    let mut b = ContiguousKv::new(model.config().layers, model.config().kv_dim(), 4);
    let err = model
        .forward(&mut [
            Entry {
                tokens: &[1, 2],
                kv: &mut a,
                want_logits: true,
            },
            Entry {
                tokens: &[1, 2, 3, 4, 5],
                kv: &mut b,
                want_logits: true,
            },
        ])
        .unwrap_err();
    assert!(err.to_string().contains("entry 1"), "{err}");
    assert_eq!(a.len(), 0, "nothing was written");
    let err = model
        .forward(&mut [Entry {
            tokens: &[VOCAB as u32],
            kv: &mut a,
            want_logits: true,
        }])
        .unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let err = model
        .forward(&mut [Entry {
            tokens: &[],
            kv: &mut a,
            want_logits: true,
        }])
        .unwrap_err();
    assert!(err.to_string().contains("no token"), "{err}");
}
