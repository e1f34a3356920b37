//! Chunk, batch and thread-count invariance, restore equals recompute (L4), greedy decoding and the local
//! windows, for every shape the model runs (`shapes`).

use kv_pool::{GroupKind, PageId, PageStorage};

use super::super::{ForwardEntry, LocalAttention, ReferenceConfig, ReferenceModel};
use super::{Request, Storages, decode, prefill, prefill_outcome, shapes, tiny_model, tokens};

#[test]
fn prefill_in_chunks_writes_the_bytes_of_one_chunk() {
    for (name, model) in shapes() {
        let prompt = tokens(1, 300, model.config().vocab);
        let whole = prefill_outcome(&model, &prompt, prompt.len());
        if name == "tiny" {
            assert_eq!(whole.pages.len(), 19);
            assert!(!whole.state.is_empty());
        }
        for chunk in [1, 7, 16, 100] {
            let chunked = prefill_outcome(&model, &prompt, chunk);
            assert!(
                chunked == whole,
                "{name}: chunks of {chunk} differ from one chunk"
            );
        }
    }
}

#[test]
fn a_request_computes_the_same_bits_alone_and_in_a_batch() {
    for (name, model) in shapes() {
        let vocab = model.config().vocab;
        let alone = Storages::new(&model);
        let mut a_alone = Request::new(&model, tokens(1, 120, vocab), 200, 1, 1);
        let batched = Storages::new(&model);
        let mut a = Request::new(&model, tokens(1, 120, vocab), 200, 1, 1);
        let mut b = Request::new(&model, tokens(2, 37, vocab), 100, 60, 10);
        let mut c = Request::new(&model, tokens(3, 250, vocab), 300, 100, 20);
        // Step 1: a prefills 50, with b whole and c's first 90 beside it.
        let out_alone = model
            .forward(alone.view(), &[a_alone.entry(50)])
            .expect("forward");
        let out = model
            .forward(batched.view(), &[b.entry(37), a.entry(50), c.entry(90)])
            .expect("forward");
        assert_eq!(out_alone[0], out[1], "{name}");
        (a_alone.n_done, a.n_done, b.n_done, c.n_done) = (50, 50, 37, 90);
        // Step 2: a prefills its remaining 70 beside c's next 160 (b has nothing left and joins no more).
        let out_alone = model
            .forward(alone.view(), &[a_alone.entry(70)])
            .expect("forward");
        let out = model
            .forward(batched.view(), &[c.entry(160), a.entry(70)])
            .expect("forward");
        assert_eq!(out_alone[0], out[1], "{name}");
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
            assert_eq!(out_alone[0], out[2], "{name}");
            for request in [&mut a_alone, &mut a, &mut b, &mut c] {
                request.n_done += 1;
            }
            assert_eq!(
                a_alone.used_bytes(&model, &alone),
                a.used_bytes(&model, &batched),
                "{name}"
            );
            assert_eq!(
                alone.state_bytes(&a_alone.state_pages),
                batched.state_bytes(&a.state_pages),
                "{name}"
            );
            next = out_alone[0].as_ref().expect("logits").next_token;
        }
    }
}

#[test]
fn the_thread_count_changes_no_bit() {
    for (name, model) in shapes() {
        let vocab = model.config().vocab;
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            pool.install(|| {
                let storages = Storages::new(&model);
                let mut a = Request::new(&model, tokens(4, 333, vocab), 400, 1, 1);
                let mut b = Request::new(&model, tokens(5, 64, vocab), 100, 100, 10);
                let out = model
                    .forward(storages.view(), &[a.entry(333), b.entry(64)])
                    .expect("forward");
                a.n_done = 333;
                b.n_done = 64;
                let pages = [
                    a.used_bytes(&model, &storages),
                    b.used_bytes(&model, &storages),
                ];
                let states = [
                    storages.state_bytes(&a.state_pages),
                    storages.state_bytes(&b.state_pages),
                ];
                (out, pages, states)
            })
        };
        assert!(run(1) == run(4), "{name}");
    }
}

#[test]
fn a_restored_prefix_continues_as_a_full_recompute() {
    for (name, model) in shapes() {
        let config = *model.config();
        let vocab = config.vocab;
        // 203 tokens: the restored prefix ends inside a page (copy-on-write of a partial page).
        let prefix_len = 203;
        let prompt = tokens(6, prefix_len + 45, vocab);
        // Recompute: the whole prompt in chunks of 64, then 16 greedy tokens.
        let full = Storages::new(&model);
        let mut recompute = Request::new(&model, prompt.clone(), 400, 1, 1);
        let logits = prefill(&model, &full, &mut recompute, 64);
        let recompute_tokens = decode(&model, &full, &mut recompute, logits, 16);
        // Restore: compute the prefix elsewhere, copy its pages (a local table's live ones only, null before
        // them, as the engine restores a checkpoint) and state pages to other page ids of another storage on
        // every rank, then continue with the same new tokens.
        let source = Storages::new(&model);
        let mut checkpoint = Request::new(&model, prompt[..prefix_len].to_vec(), 400, 30, 90);
        let _logits = prefill(&model, &source, &mut checkpoint, 100);
        let restored = Storages::new(&model);
        let mut continued = Request::new(&model, prompt.clone(), 400, 100, 50);
        let copy = |from_storage: &dyn PageStorage, to_storage: &dyn PageStorage, from, to| {
            for rank in 0..config.context_parallel {
                let mut bytes = vec![0u8; from_storage.bytes_per_page()];
                from_storage.read(rank, from, &mut bytes).expect("read");
                to_storage.write(rank, to, &bytes).expect("copy");
            }
        };
        for (&from, &to) in checkpoint.used_pages(&model).iter().zip(&continued.pages) {
            copy(&source.attention, &restored.attention, from, to);
        }
        if let (Some(from_storage), Some(to_storage)) = (&source.local, &restored.local) {
            let geometry = config.geometry(4096).expect("geometry");
            let live = geometry.live_tokens(1, prefix_len as u32);
            let first_live = (live.start / config.block_tokens()) as usize;
            let n_used = config.pages_for_tokens(prefix_len as u32) as usize;
            for slot in 0..n_used {
                if slot < first_live {
                    continued.local_pages[slot] = PageId::NULL;
                } else {
                    let (from, to) = (checkpoint.local_pages[slot], continued.local_pages[slot]);
                    copy(from_storage, to_storage, from, to);
                }
            }
        }
        if let (Some(from_storage), Some(to_storage)) = (&source.recurrent, &restored.recurrent) {
            for (&from, &to) in checkpoint.state_pages.iter().zip(&continued.state_pages) {
                copy(from_storage, to_storage, from, to);
            }
        }
        continued.n_done = prefix_len;
        let logits = prefill(&model, &restored, &mut continued, 64);
        let continued_tokens = decode(&model, &restored, &mut continued, logits, 16);
        assert_eq!(continued_tokens, recompute_tokens, "{name}");
        assert_eq!(
            restored.attention_bytes(continued.used_pages(&model)),
            full.attention_bytes(recompute.used_pages(&model)),
            "{name}"
        );
        assert_eq!(
            restored.state_bytes(&continued.state_pages),
            full.state_bytes(&recompute.state_pages),
            "{name}"
        );
    }
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

/// A local table null before the window of the last chunk's first position gives the logits of a table
/// whose every page is there: the local layers read no page before their window.
fn check_local_window_reads_no_page_before_it(window: GroupKind, null_slots: usize) {
    let model = ReferenceModel::new(ReferenceConfig {
        local: Some(LocalAttention {
            n_layers: 1,
            window,
        }),
        n_recurrent_layers: 0,
        ..ReferenceConfig::tiny()
    })
    .expect("valid");
    let prompt = tokens(10, 200, 512);
    let whole = prefill_outcome(&model, &prompt, 200);
    for chunk in [1, 16, 50] {
        assert!(
            prefill_outcome(&model, &prompt, chunk) == whole,
            "{window:?}: chunks of {chunk}"
        );
    }
    let storages = Storages::new(&model);
    let mut request = Request::new(&model, prompt.clone(), 200, 1, 1);
    let _logits = prefill(&model, &storages, &mut request, 180);
    let mut local = request.local_pages.clone();
    local[..null_slots].fill(PageId::NULL);
    let entry = ForwardEntry {
        tokens: &prompt[180..],
        first_pos: 180,
        attention_pages: &request.pages,
        local_pages: &local,
        state_pages: &[],
        want_logits: true,
    };
    let out = model.forward(storages.view(), &[entry]).expect("forward");
    assert_eq!(out[0].as_ref(), Some(&whole.logits), "{window:?}");
    // One more null slot is refused: the window reads it.
    let mut one_more = local.clone();
    one_more[null_slots] = PageId::NULL;
    let entry = ForwardEntry {
        local_pages: &one_more,
        ..entry
    };
    let err = model
        .forward(storages.view(), &[entry])
        .expect_err("refused");
    assert!(
        matches!(err, super::super::ModelError::NullPage { group: "local", slot, .. } if slot == null_slots),
        "{err}"
    );
}

#[test]
fn a_sliding_window_reads_no_page_before_it_and_chunks_change_no_bit() {
    // The last chunk [180, 200) reads from position 140 on: slots 0..8 (positions below 128) may be null.
    check_local_window_reads_no_page_before_it(
        GroupKind::SlidingWindow {
            window_tokens: 40,
            retained_tail_tokens: 0,
        },
        8,
    );
}

#[test]
fn a_chunked_local_layer_reads_no_chunk_before_its_own() {
    // The last chunk [180, 200) is in the aligned chunk [160, 224): slots 0..10 (positions below 160) may be
    // null.
    check_local_window_reads_no_page_before_it(GroupKind::ChunkedLocal { chunk_tokens: 32 }, 10);
}

#[test]
fn every_rank_holds_its_share_of_a_block() {
    // Two ranks of 8-token pages: the first 16 tokens make block 0; token p lives on rank p % 2.
    let model = ReferenceModel::new(ReferenceConfig {
        tokens_per_page: 8,
        context_parallel: 2,
        n_recurrent_layers: 0,
        ..ReferenceConfig::tiny()
    })
    .expect("valid");
    let one_rank = ReferenceModel::new(ReferenceConfig {
        tokens_per_page: 16,
        n_recurrent_layers: 0,
        ..ReferenceConfig::tiny()
    })
    .expect("valid");
    let prompt = tokens(11, 16, 512);
    let sharded = prefill_outcome(&model, &prompt, 16);
    let whole = prefill_outcome(&one_rank, &prompt, 16);
    // The same model computes the same keys and logits; only where they are stored differs.
    assert_eq!(sharded.logits, whole.logits);
    let inner = model.config().inner_dim() * 4;
    let (ranks, one) = (&sharded.pages[0], &whole.pages[0]);
    let page = ranks.len() / 2;
    for token in 0..16 {
        let rank = token % 2;
        let at = rank * page + (token / 2) * inner;
        assert_eq!(
            ranks[at..at + inner],
            one[token * inner..(token + 1) * inner],
            "key of token {token}"
        );
    }
}
