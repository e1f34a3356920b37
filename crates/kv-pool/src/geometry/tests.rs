//! Unit tests of the geometry arithmetic: every function and every construction error.

use super::{CacheGroup, Continuation, Geometry, GroupKind, RestoreNeed};
use crate::error::Error;

fn group(kind: GroupKind) -> CacheGroup {
    CacheGroup {
        kind,
        bytes_per_page: 4096,
    }
}

fn geometry(kinds: &[GroupKind], tokens_per_page: u32, context_parallel: u32) -> Geometry {
    let groups = kinds.iter().map(|&kind| group(kind)).collect();
    Geometry::new(groups, tokens_per_page, context_parallel, 1 << 20).expect("valid geometry")
}

fn sliding(window_tokens: u32, retained_tail_tokens: u32) -> GroupKind {
    GroupKind::SlidingWindow {
        window_tokens,
        retained_tail_tokens,
    }
}

fn chunked(chunk_tokens: u32) -> GroupKind {
    GroupKind::ChunkedLocal { chunk_tokens }
}

fn continuation(
    prefix_tokens: u32,
    prompt_tokens: u32,
    chunk_tokens: u32,
    draft: u32,
) -> Continuation {
    Continuation {
        prefix_tokens,
        prompt_tokens,
        chunk_tokens,
        draft_lookahead_tokens: draft,
        captures: 0,
    }
}

fn check_new(
    groups: Vec<CacheGroup>,
    tokens_per_page: u32,
    cp: u32,
    max_model_len: u32,
    expect: &Error,
) {
    let got = Geometry::new(groups, tokens_per_page, cp, max_model_len);
    assert_eq!(got.as_ref().err(), Some(expect), "{got:?}");
    assert!(!expect.to_string().is_empty());
}

#[test]
fn new_rejects_every_zero_and_oversize() {
    let full = vec![group(GroupKind::Full)];
    check_new(full.clone(), 0, 1, 64, &Error::ZeroTokensPerPage);
    check_new(full.clone(), 4, 0, 64, &Error::ZeroContextParallel);
    check_new(full.clone(), 4, 1, 0, &Error::ZeroMaxModelLen);
    check_new(Vec::new(), 4, 1, 64, &Error::NoCacheGroups);
    check_new(
        full.clone(),
        u32::MAX,
        2,
        64,
        &Error::BlockTooLarge {
            tokens_per_page: u32::MAX,
            context_parallel: 2,
            max: u32::MAX,
        },
    );
    let zero_bytes = vec![
        group(GroupKind::Full),
        CacheGroup {
            kind: GroupKind::Full,
            bytes_per_page: 0,
        },
    ];
    check_new(
        zero_bytes,
        4,
        1,
        64,
        &Error::ZeroBytesPerPage { group_idx: 1 },
    );
    check_new(
        vec![group(sliding(0, 2))],
        4,
        1,
        64,
        &Error::ZeroWindow { group_idx: 0 },
    );
    check_new(
        vec![group(GroupKind::Full), group(chunked(0))],
        4,
        1,
        64,
        &Error::ZeroChunk { group_idx: 1 },
    );
    check_new(
        vec![group(GroupKind::Auxiliary { pages: 0 })],
        4,
        1,
        64,
        &Error::ZeroAuxiliaryPages { group_idx: 0 },
    );
    check_new(
        vec![group(sliding(65, 0))],
        4,
        1,
        64,
        &Error::WindowExceedsModelLen {
            group_idx: 0,
            window_tokens: 65,
            max_model_len: 64,
        },
    );
    check_new(
        vec![group(GroupKind::Full), group(sliding(16, u32::MAX))],
        4,
        1,
        64,
        &Error::TailExceedsModelLen {
            group_idx: 1,
            window_tokens: 16,
            retained_tail_tokens: u32::MAX,
            max_model_len: 64,
        },
    );
    check_new(
        vec![group(GroupKind::Recurrent), group(chunked(100))],
        4,
        1,
        64,
        &Error::ChunkExceedsModelLen {
            group_idx: 1,
            chunk_tokens: 100,
            max_model_len: 64,
        },
    );
    let message = Error::WindowExceedsModelLen {
        group_idx: 3,
        window_tokens: 65,
        max_model_len: 64,
    }
    .to_string();
    assert!(
        message.contains("group 3") && message.contains("65") && message.contains("64"),
        "{message}"
    );
}

#[test]
fn new_keeps_its_fields() {
    let geo = Geometry::new(vec![group(sliding(64, 64))], 16, 2, 64)
        .expect("window == max_model_len is fine");
    assert_eq!(geo.tokens_per_page(), 16);
    assert_eq!(geo.context_parallel(), 2);
    assert_eq!(geo.max_model_len(), 64);
    assert_eq!(geo.groups(), &[group(sliding(64, 64))]);
    assert!(
        GroupKind::Full.is_attention() && sliding(1, 0).is_attention() && chunked(1).is_attention()
    );
    assert!(
        !GroupKind::Recurrent.is_attention() && !GroupKind::Auxiliary { pages: 1 }.is_attention()
    );
}

#[test]
fn span_pages_counts_partial_pages_and_shards_over_ranks() {
    let cp1 = geometry(&[GroupKind::Full], 4, 1);
    for (start, end, expect) in [
        (0, 4, 1),
        (0, 5, 2),
        (3, 5, 2),
        (4, 4, 0),
        (5, 3, 0),
        (0, 0, 0),
        (7, 9, 2),
    ] {
        assert_eq!(cp1.span_pages(start, end), expect, "cp1 [{start}, {end})");
    }
    let cp2 = geometry(&[GroupKind::Full], 4, 2);
    // Rank r holds tokens i with i % 2 == r; a page id holds a block of 8 tokens on both ranks.
    for (start, end, expect) in [
        (0, 8, 1),
        (0, 9, 2),
        (1, 9, 2),
        (8, 9, 1),
        (0, 16, 2),
        (0, 17, 3),
        (2, 3, 1),
    ] {
        assert_eq!(cp2.span_pages(start, end), expect, "cp2 [{start}, {end})");
    }
}

#[test]
fn live_tokens_of_every_kind() {
    let geo = geometry(
        &[
            GroupKind::Full,
            sliding(8, 0),
            sliding(8, 4),
            chunked(16),
            GroupKind::Recurrent,
            GroupKind::Auxiliary { pages: 2 },
        ],
        4,
        1,
    );
    assert_eq!(geo.live_tokens(0, 20), 0..20);
    assert_eq!(geo.live_tokens(1, 20), 12..20);
    assert_eq!(geo.live_tokens(1, 5), 0..5);
    assert_eq!(geo.live_tokens(2, 20), 8..20);
    assert_eq!(geo.live_tokens(3, 20), 16..20);
    assert_eq!(geo.live_tokens(3, 32), 32..32);
    assert_eq!(geo.live_tokens(4, 20), 20..20);
    assert_eq!(geo.live_tokens(5, 20), 20..20);
}

#[test]
fn live_pages_and_group_pages_for_tokens() {
    let geo = geometry(
        &[
            GroupKind::Full,
            sliding(8, 0),
            sliding(8, 4),
            chunked(16),
            GroupKind::Recurrent,
            GroupKind::Auxiliary { pages: 2 },
        ],
        4,
        1,
    );
    // live pages at n = 21: full 6; window 13..21 -> pages 3,4,5; window+tail 9..21 -> pages 2..=5; chunk
    // 16..21 -> pages 4,5; recurrent 1; auxiliary 2.
    let expect = [6, 3, 4, 2, 1, 2];
    for (group_idx, expect) in expect.into_iter().enumerate() {
        assert_eq!(geo.live_pages(group_idx, 21), expect, "group {group_idx}");
        assert_eq!(geo.live_pages(group_idx, 0), 0, "group {group_idx} empty");
    }
    assert_eq!(
        geo.live_pages(3, 32),
        0,
        "a chunk boundary leaves nothing live"
    );
    // [4, 21): full pages 1..=5; window limits it to its live range.
    assert_eq!(geo.group_pages_for_tokens(0, 4, 21), 5);
    assert_eq!(geo.group_pages_for_tokens(1, 4, 21), 3);
    assert_eq!(geo.group_pages_for_tokens(1, 18, 21), 2);
    assert_eq!(geo.group_pages_for_tokens(3, 4, 21), 2);
    assert_eq!(geo.group_pages_for_tokens(4, 4, 21), 1);
    assert_eq!(geo.group_pages_for_tokens(5, 4, 21), 2);
    assert_eq!(geo.group_pages_for_tokens(5, 4, 4), 0);
}

#[test]
fn ends_inside_page_per_rank() {
    let cp1 = geometry(&[GroupKind::Full], 4, 1);
    assert!(!cp1.ends_inside_page(0));
    assert!(!cp1.ends_inside_page(4));
    assert!(cp1.ends_inside_page(5));
    let cp2 = geometry(&[GroupKind::Full], 4, 2);
    assert!(!cp2.ends_inside_page(8));
    assert!(cp2.ends_inside_page(9));
    assert!(cp2.ends_inside_page(4));
    assert!(!cp2.ends_inside_page(16));
}

#[test]
fn checkpoint_and_capture_pages() {
    let geo = geometry(
        &[
            GroupKind::Full,
            sliding(8, 0),
            GroupKind::Recurrent,
            GroupKind::Auxiliary { pages: 3 },
        ],
        4,
        1,
    );
    assert_eq!(geo.checkpoint_pages(21), 6 + 3 + 1 + 3);
    assert_eq!(geo.checkpoint_pages(0), 0);
    assert_eq!(geo.capture_pages(), 1 + 1 + 1 + 3);
}

#[test]
fn full_group_continuation_counts_cow_and_replay() {
    let geo = geometry(&[GroupKind::Full], 4, 1);
    // Prefix 5 ends inside page 1: pages 1 (copy-on-write), 2, 3 for [5, 13).
    assert_eq!(geo.continuation_pages(&continuation(5, 13, 16, 0)), 3);
    // On a boundary: pages 1, 2 only; with draft the lookahead token and the replay page.
    assert_eq!(geo.continuation_pages(&continuation(4, 12, 16, 0)), 2);
    assert_eq!(geo.continuation_pages(&continuation(4, 12, 16, 1)), 3 + 1);
    // Inside a page with draft: no replay page (the copy-on-write covers it).
    assert_eq!(geo.continuation_pages(&continuation(5, 12, 16, 1)), 3);
    // Chunk size does not matter for a full group.
    for chunk in [1, 16, 33, 127] {
        assert_eq!(geo.continuation_pages(&continuation(5, 300, chunk, 0)), 74);
    }
}

#[test]
fn continuation_pages_adds_captures_recurrent_and_auxiliary() {
    let geo = geometry(
        &[
            GroupKind::Full,
            GroupKind::Recurrent,
            GroupKind::Auxiliary { pages: 2 },
        ],
        4,
        1,
    );
    let mut cont = continuation(8, 9, 16, 0);
    assert_eq!(geo.continuation_pages(&cont), 1 + 1 + 2);
    cont.captures = 2;
    assert_eq!(geo.continuation_pages(&cont), 1 + 1 + 2 + 2 * 4);
    assert_eq!(geo.group_continuation_pages(1, &cont), 1);
    assert_eq!(geo.group_continuation_pages(2, &cont), 2);
}

/// Brute force: the peak pages a windowed group holds when the continuation runs in chunks of exactly `chunk`
/// tokens from the prefix, freeing pages that left the window after every chunk.
fn simulated_window_peak(geo: &Geometry, group_idx: usize, cont: &Continuation, chunk: u32) -> u32 {
    let prefix = cont.prefix_tokens;
    let mut start = prefix;
    let mut peak = 0;
    while start < cont.prompt_tokens {
        let end = (start + chunk).min(cont.prompt_tokens) + cont.draft_lookahead_tokens;
        let live_start = geo.live_tokens(group_idx, start).start.max(prefix);
        peak = peak.max(geo.span_pages(live_start, end));
        start = (start + chunk).min(cont.prompt_tokens);
    }
    peak
}

#[test]
fn windowed_continuation_covers_every_chunking_and_stays_below_full_span() {
    for cp in [1, 2] {
        let geo = geometry(
            &[sliding(32, 0), sliding(32, 8), chunked(64), chunked(16)],
            16,
            cp,
        );
        for (prefix, prompt) in [
            (64, 400),
            (70, 400),
            (0, 300),
            (400, 401),
            (399, 401),
            (96, 97),
        ] {
            for chunk in [1, 16, 33, 127] {
                for draft in [0, 3] {
                    let cont = continuation(prefix, prompt, chunk, draft);
                    for group_idx in 0..4 {
                        let credits = geo.group_continuation_pages(group_idx, &cont);
                        let replay =
                            u32::from(draft > 0 && prefix > 0 && !geo.ends_inside_page(prefix));
                        let full = geo.span_pages(prefix, prompt + draft) + replay;
                        assert!(
                            credits <= full,
                            "cp {cp} {cont:?} group {group_idx}: {credits} > {full}"
                        );
                        for smaller in [1, chunk / 2, chunk] {
                            let peak =
                                simulated_window_peak(&geo, group_idx, &cont, smaller.max(1));
                            assert!(
                                credits >= peak,
                                "cp {cp} {cont:?} group {group_idx} chunk {smaller}: {credits} < {peak}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn windowed_continuation_is_the_window_not_the_suffix() {
    let geo = geometry(&[sliding(32, 0), sliding(32, 32), chunked(64)], 16, 1);
    let cont = continuation(64, 4096, 16, 0);
    // Window 32 + chunk 16 = 48 tokens at most, 4 pages at any alignment; the suffix alone is 252 pages.
    assert_eq!(geo.group_continuation_pages(0, &cont), 4);
    assert_eq!(geo.group_continuation_pages(1, &cont), 6);
    assert_eq!(geo.group_continuation_pages(2, &cont), 6);
    assert_eq!(geo.span_pages(64, 4096), 252);
}

#[test]
fn restore_need_request_peak_and_fit() {
    let geo = geometry(&[GroupKind::Full, GroupKind::Recurrent], 4, 1);
    let cont = Continuation {
        captures: 1,
        ..continuation(8, 16, 4, 0)
    };
    let need = geo.restore_need(&cont);
    assert_eq!(
        need,
        RestoreNeed {
            import_pages: 2 + 1,
            credit_pages: 2 + 1 + 2,
        }
    );
    assert_eq!(need.total_pages(), 8);
    assert_eq!(geo.request_peak_pages(16, 4, 0), 4 + 1);
    assert_eq!(geo.request_peak_pages(16, 4, 1), 5 + 1);
    assert!(Geometry::fits_empty_pool(8, 8));
    assert!(!Geometry::fits_empty_pool(9, 8));
}
