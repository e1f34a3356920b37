//! Chunk, batch and thread-count invariance, restore equals recompute (L4), greedy decoding and the sliding
//! window.

use kv_pool::{PageId, PageStorage};

use super::super::{ForwardEntry, ReferenceConfig, ReferenceModel};
use super::{Request, Storages, decode, prefill, prefill_outcome, tiny_model, tokens};

#[test]
fn prefill_in_chunks_writes_the_bytes_of_one_chunk() {
    let model = tiny_model();
    let prompt = tokens(1, 300, model.config().vocab);
    let whole = prefill_outcome(&model, &prompt, prompt.len());
    assert_eq!(whole.pages.len(), 19);
    assert!(!whole.state.is_empty());
    for chunk in [1, 7, 16, 100] {
        let chunked = prefill_outcome(&model, &prompt, chunk);
        assert!(chunked == whole, "chunks of {chunk} differ from one chunk");
    }
}

#[test]
fn a_request_computes_the_same_bits_alone_and_in_a_batch() {
    let model = tiny_model();
    let vocab = model.config().vocab;
    let alone = Storages::new(&model);
    let mut a_alone = Request::new(&model, tokens(1, 120, vocab), 200, 1, 1);
    let batched = Storages::new(&model);
    let mut a = Request::new(&model, tokens(1, 120, vocab), 200, 1, 1);
    let mut b = Request::new(&model, tokens(2, 37, vocab), 100, 60, 2);
    let mut c = Request::new(&model, tokens(3, 250, vocab), 300, 100, 3);
    // Step 1: a prefills 50, with b whole and c's first 90 beside it.
    let out_alone = model
        .forward(alone.view(), &[a_alone.entry(50)])
        .expect("forward");
    let out = model
        .forward(batched.view(), &[b.entry(37), a.entry(50), c.entry(90)])
        .expect("forward");
    assert_eq!(out_alone[0], out[1]);
    (a_alone.n_done, a.n_done, b.n_done, c.n_done) = (50, 50, 37, 90);
    // Step 2: a prefills its remaining 70 beside c's next 160 (b has nothing left and joins no more).
    let out_alone = model
        .forward(alone.view(), &[a_alone.entry(70)])
        .expect("forward");
    let out = model
        .forward(batched.view(), &[c.entry(160), a.entry(70)])
        .expect("forward");
    assert_eq!(out_alone[0], out[1]);
    (a_alone.n_done, a.n_done, c.n_done) = (120, 120, 250);
    // Decodes: a alone and a batched beside b and c.
    let mut next = out_alone[0].as_ref().expect("logits").next_token;
    for _ in 0..4 {
        for request in [&mut a_alone, &mut a, &mut b, &mut c] {
            request.tokens.push(next);
        }
        let out_alone = model
            .forward(alone.view(), &[a_alone.entry(1)])
            .expect("forward");
        let out = model
            .forward(batched.view(), &[c.entry(1), b.entry(1), a.entry(1)])
            .expect("forward");
        assert_eq!(out_alone[0], out[2]);
        for request in [&mut a_alone, &mut a, &mut b, &mut c] {
            request.n_done += 1;
        }
        assert_eq!(
            alone.attention_bytes(a_alone.used_pages(&model)),
            batched.attention_bytes(a.used_pages(&model))
        );
        assert_eq!(alone.state_bytes(PageId(1)), batched.state_bytes(PageId(1)));
        next = out_alone[0].as_ref().expect("logits").next_token;
    }
}

#[test]
fn the_thread_count_changes_no_bit() {
    let model = tiny_model();
    let vocab = model.config().vocab;
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| {
            let storages = Storages::new(&model);
            let mut a = Request::new(&model, tokens(4, 333, vocab), 400, 1, 1);
            let mut b = Request::new(&model, tokens(5, 64, vocab), 100, 100, 2);
            let out = model
                .forward(storages.view(), &[a.entry(333), b.entry(64)])
                .expect("forward");
            a.n_done = 333;
            b.n_done = 64;
            let pages = [
                storages.attention_bytes(a.used_pages(&model)),
                storages.attention_bytes(b.used_pages(&model)),
            ];
            let states = [
                storages.state_bytes(PageId(1)),
                storages.state_bytes(PageId(2)),
            ];
            (out, pages, states)
        })
    };
    assert_eq!(run(1), run(4));
}

#[test]
fn a_restored_prefix_continues_as_a_full_recompute() {
    let model = tiny_model();
    let vocab = model.config().vocab;
    // 203 tokens: the restored prefix ends inside a page (copy-on-write of a partial page).
    let prefix_len = 203;
    let prompt = tokens(6, prefix_len + 45, vocab);
    // Recompute: the whole prompt in chunks of 64, then 16 greedy tokens.
    let full = Storages::new(&model);
    let mut recompute = Request::new(&model, prompt.clone(), 400, 1, 1);
    let logits = prefill(&model, &full, &mut recompute, 64);
    let recompute_tokens = decode(&model, &full, &mut recompute, logits, 16);
    // Restore: compute the prefix elsewhere, copy its pages and state page to other page ids of another
    // storage (as a restore would), then continue with the same new tokens.
    let source = Storages::new(&model);
    let mut checkpoint = Request::new(&model, prompt[..prefix_len].to_vec(), 400, 30, 9);
    let _logits = prefill(&model, &source, &mut checkpoint, 100);
    let restored = Storages::new(&model);
    let mut continued = Request::new(&model, prompt.clone(), 400, 100, 5);
    for (&from, &to) in checkpoint.used_pages(&model).iter().zip(&continued.pages) {
        restored
            .attention
            .write(0, to, &super::read(&source.attention, from))
            .expect("copy");
    }
    let state = source.state_bytes(PageId(9));
    if let Some(storage) = &restored.recurrent {
        storage.write(0, PageId(5), &state).expect("copy");
    }
    continued.n_done = prefix_len;
    let logits = prefill(&model, &restored, &mut continued, 64);
    let continued_tokens = decode(&model, &restored, &mut continued, logits, 16);
    assert_eq!(continued_tokens, recompute_tokens);
    assert_eq!(
        restored.attention_bytes(continued.used_pages(&model)),
        full.attention_bytes(recompute.used_pages(&model))
    );
    assert_eq!(restored.state_bytes(PageId(5)), full.state_bytes(PageId(1)));
}

#[test]
fn greedy_decoding_is_deterministic_and_in_range() {
    let run = || {
        let model = tiny_model();
        let storages = Storages::new(&model);
        let mut request = Request::new(&model, tokens(8, 40, 512), 200, 1, 1);
        let logits = prefill(&model, &storages, &mut request, 40);
        decode(&model, &storages, &mut request, logits, 64)
    };
    let first = run();
    assert_eq!(first, run());
    assert!(first.iter().all(|&token| token < 512));
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 4, "the model is degenerate: {first:?}");
}

#[test]
fn another_seed_gives_other_logits() {
    let prompt = tokens(9, 30, 512);
    let logits = |seed| {
        let model = ReferenceModel::new(ReferenceConfig {
            seed,
            ..ReferenceConfig::tiny()
        })
        .expect("valid");
        super::prefill_outcome(&model, &prompt, 30).logits
    };
    assert_ne!(logits(1).values, logits(2).values);
}

#[test]
fn a_sliding_window_reads_no_page_before_it_and_chunks_change_no_bit() {
    let model = ReferenceModel::new(ReferenceConfig {
        window_tokens: Some(40),
        n_recurrent_layers: 0,
        ..ReferenceConfig::tiny()
    })
    .expect("valid");
    let prompt = tokens(10, 200, 512);
    let whole = prefill_outcome(&model, &prompt, 200);
    for chunk in [1, 16, 50] {
        assert!(
            prefill_outcome(&model, &prompt, chunk) == whole,
            "chunks of {chunk}"
        );
    }
    // The last chunk [180, 200) reads from position 140 on: slots 0..8 (positions below 128) may be null.
    let storages = Storages::new(&model);
    let mut request = Request::new(&model, prompt.clone(), 200, 1, 1);
    let _logits = prefill(&model, &storages, &mut request, 180);
    let mut table = request.pages.clone();
    table[..8].fill(PageId::NULL);
    let entry = ForwardEntry {
        tokens: &prompt[180..],
        first_pos: 180,
        attention_pages: &table,
        recurrent_page: None,
        want_logits: true,
    };
    let out = model.forward(storages.view(), &[entry]).expect("forward");
    assert_eq!(out[0].as_ref(), Some(&whole.logits));
}
