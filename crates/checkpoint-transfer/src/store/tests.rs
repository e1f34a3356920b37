//! Store tiers: prefix lookup, recency, capacity, generations; the disk store's crash safety and G6
//! rejection of truncated, corrupted and foreign files. Block-prefix lookup in `prefix`; the disk store's
//! ownership, shrinking, hostile files, manifest checksum and write failures in `durability`; kill -9 at
//! random points in `crash`; the Redis store against a real server in `redis`; the skeleton the tiers share, on
//! a fake tier, in `tier`; the threaded `StoreLink` in `link`.

use kv_pool::BlockKey;

use crate::checkpoint::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, PrefixQuery,
};
use crate::error::{Error, Mismatch};
use kv_pool::GroupKind;

use crate::layout::LayoutDescriptor;
use crate::page_buf::RankPages;
use crate::store::manifest::{MANIFEST_FORMAT_VERSION, seal as seal_manifest};
use crate::store::{CheckpointStore, DiskStore, HostStore};

mod crash;
mod durability;
mod link;
mod prefix;
mod redis;
mod tier;

const BYTES_PER_PAGE: u64 = 64;
const TOKENS_PER_PAGE: u32 = 4;

fn layout() -> LayoutDescriptor {
    LayoutDescriptor::single_full(BYTES_PER_PAGE, TOKENS_PER_PAGE, 2)
}

fn checkpoint(id: &str, generation: u64, tokens: &[u32]) -> Checkpoint {
    let meta = CheckpointMeta::full_attention(
        CheckpointId::new(id).unwrap(),
        generation,
        CheckpointKind::Prompt,
        tokens,
        b"salt",
        layout(),
    );
    let ranks = (0..2u8)
        .map(|rank| {
            (0..meta.pages.len())
                .map(|page| {
                    let bytes: Vec<u8> = (0..BYTES_PER_PAGE)
                        .map(|i| {
                            (i as u8) ^ rank.wrapping_mul(31) ^ (page as u8) ^ (generation as u8)
                        })
                        .collect();
                    bytes
                })
                .collect::<Vec<_>>()
        })
        .map(|pages| {
            RankPages::from_pages(pages.iter().map(Vec::as_slice), BYTES_PER_PAGE as usize)
        })
        .collect();
    Checkpoint {
        meta,
        payload: CheckpointPayload { ranks },
    }
}

fn tokens(n: u32) -> Vec<u32> {
    (100..100 + n).collect()
}

fn find(store: &mut dyn CheckpointStore, request: &[u32]) -> Option<String> {
    let keys = BlockKey::chain_all(request, TOKENS_PER_PAGE as usize, b"salt");
    let query = PrefixQuery {
        block_keys: &keys,
        tokens: request,
    };
    store
        .find_longest(&query)
        .map(|meta| meta.id.as_str().to_string())
}

/// One checkpoint's payload bytes: 3 pages (10 tokens) on 2 ranks.
const TEN_TOKEN_BYTES: u64 = 3 * 2 * BYTES_PER_PAGE;

#[test]
fn host_store_finds_the_longest_prefix_checkpoint() {
    let mut store = HostStore::new(1 << 20);
    store.put(checkpoint("short", 1, &tokens(5))).unwrap();
    store.put(checkpoint("long", 1, &tokens(10))).unwrap();
    store.put(checkpoint("other", 1, &[7; 12])).unwrap();
    assert_eq!(find(&mut store, &tokens(20)).as_deref(), Some("long"));
    assert_eq!(find(&mut store, &tokens(9)).as_deref(), Some("short"));
    assert_eq!(find(&mut store, &tokens(4)), None);
    // A partial tail must match exactly.
    let mut diverging = tokens(10);
    diverging[9] = 0;
    assert_eq!(find(&mut store, &diverging).as_deref(), Some("short"));
    let stats = store.stats();
    assert_eq!(stats.n_checkpoints, 3);
    assert_eq!(
        stats.n_bytes,
        TEN_TOKEN_BYTES + 2 * 2 * BYTES_PER_PAGE + 3 * 2 * BYTES_PER_PAGE
    );
}

#[test]
fn host_store_evicts_least_recently_used_and_lookup_refreshes_recency() {
    let mut store = HostStore::new(2 * TEN_TOKEN_BYTES);
    store.put(checkpoint("a", 1, &tokens(10))).unwrap();
    store.put(checkpoint("b", 1, &[9; 10])).unwrap();
    // Touch "a": "b" becomes the least recently used.
    assert_eq!(find(&mut store, &tokens(10)).as_deref(), Some("a"));
    let outcome = store.put(checkpoint("c", 1, &[8; 10])).unwrap();
    assert_eq!(outcome.evicted, vec![CheckpointId::new("b").unwrap()]);
    assert!(store.meta(&CheckpointId::new("a").unwrap()).is_some());
    assert_eq!(store.stats().n_evictions, 1);
}

#[test]
fn newer_generation_supersedes_and_older_is_refused() {
    let mut store = HostStore::new(1 << 20);
    let id = CheckpointId::new("s").unwrap();
    store.put(checkpoint("s", 2, &tokens(10))).unwrap();
    let stale = store.put(checkpoint("s", 1, &tokens(10))).unwrap_err();
    assert!(
        matches!(
            stale,
            Error::StaleGeneration {
                generation: 1,
                stored: 2,
                ..
            }
        ),
        "{stale}"
    );
    let outcome = store.put(checkpoint("s", 3, &tokens(12))).unwrap();
    assert_eq!(outcome.superseded_generation, Some(2));
    let got = store.get(&id).unwrap();
    assert_eq!(got, checkpoint("s", 3, &tokens(12)));
    assert_eq!(store.stats().n_checkpoints, 1);
}

#[test]
fn checkpoint_larger_than_the_store_is_refused() {
    let mut store = HostStore::new(10);
    let err = store.put(checkpoint("big", 1, &tokens(10))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                bytes: TEN_TOKEN_BYTES,
                capacity_bytes: 10,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.stats().n_checkpoints, 0);
}

#[test]
fn g6_manifest_mismatch_names_what_differs() {
    let meta = checkpoint("x", 1, &tokens(10)).meta;
    let request = tokens(12);
    let keys = BlockKey::chain_all(&request, TOKENS_PER_PAGE as usize, b"salt");
    let query = PrefixQuery {
        block_keys: &keys,
        tokens: &request,
    };
    assert_eq!(meta.check_restorable(&layout(), &query), Ok(()));
    let mut engine = layout();
    engine.n_ranks = 4;
    assert_eq!(
        meta.check_restorable(&engine, &query),
        Err(Mismatch::Ranks {
            expected: 4,
            found: 2
        })
    );
    let mut engine = layout();
    engine.bytes_per_page = 128;
    assert_eq!(
        meta.check_restorable(&engine, &query),
        Err(Mismatch::PageWidth {
            expected: 128,
            found: 64
        })
    );
    let mut engine = layout();
    engine.groups = vec![GroupKind::Recurrent, GroupKind::Full];
    let groups = meta.check_restorable(&engine, &query).unwrap_err();
    assert!(groups.to_string().contains("[recurrent, full]"), "{groups}");
    let mut engine = layout();
    engine.tokens_per_page = 8;
    assert!(matches!(
        meta.check_restorable(&engine, &query),
        Err(Mismatch::TokensPerPage { .. })
    ));
    let other_request = tokens(3);
    let other_keys = BlockKey::chain_all(&other_request, TOKENS_PER_PAGE as usize, b"salt");
    let other = PrefixQuery {
        block_keys: &other_keys,
        tokens: &other_request,
    };
    assert_eq!(
        meta.check_restorable(&layout(), &other),
        Err(Mismatch::TokenPrefix { n_tokens: 10 })
    );
}

#[test]
fn restore_after_reopen_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint("session-1/turn-3", 4, &tokens(10));
    {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(original.clone()).unwrap();
    }
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert!(store.rejected().is_empty(), "{:?}", store.rejected());
    assert_eq!(
        find(&mut store, &tokens(11)).as_deref(),
        Some("session-1/turn-3")
    );
    assert_eq!(store.get(&original.meta.id).unwrap(), original);
    assert_eq!(store.stats().n_bytes, TEN_TOKEN_BYTES);
}

#[test]
fn leftover_temp_file_is_ignored_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let kept = checkpoint("kept", 1, &tokens(10));
    {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(kept.clone()).unwrap();
        // A crash in the middle of writing another checkpoint leaves temp files behind.
        let half = store.manifest_path(&CheckpointId::new("half").unwrap());
        let mut temp = half.into_os_string();
        temp.push(".tmp");
        std::fs::write(&temp, b"KVGATECK partial").unwrap();
        let payload = store.payload_path(&CheckpointId::new("half").unwrap(), 1);
        let mut temp = payload.into_os_string();
        temp.push(".tmp");
        std::fs::write(&temp, [0u8; 100]).unwrap();
    }
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert!(store.rejected().is_empty(), "{:?}", store.rejected());
    assert_eq!(store.stats().n_checkpoints, 1);
    assert_eq!(store.get(&kept.meta.id).unwrap(), kept);
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn g6_flipped_payload_byte_is_detected_and_never_restored() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint("flip", 1, &tokens(10));
    let payload_path = {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(original.clone()).unwrap();
        store.payload_path(&original.meta.id, 1)
    };
    let mut bytes = std::fs::read(&payload_path).unwrap();
    bytes[200] ^= 0x01;
    std::fs::write(&payload_path, bytes).unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    let err = store.get(&original.meta.id).unwrap_err();
    assert!(err.to_string().contains("fails its checksum"), "{err}");
    // Never restored: a later lookup no longer finds it.
    assert_eq!(find(&mut store, &tokens(10)), None);
    assert!(matches!(
        store.get(&original.meta.id),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn g6_truncated_manifest_is_rejected_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint("trunc", 1, &tokens(10));
    let manifest_path = {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(original.clone()).unwrap();
        store.manifest_path(&original.meta.id)
    };
    let bytes = std::fs::read(&manifest_path).unwrap();
    std::fs::write(&manifest_path, &bytes[..bytes.len() / 2]).unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.rejected().len(), 1);
    assert_eq!(store.rejected()[0].path, manifest_path);
    assert!(
        store.rejected()[0].reason.starts_with("truncated manifest"),
        "{:?}",
        store.rejected()
    );
    assert_eq!(store.stats().n_checkpoints, 0);
    assert_eq!(find(&mut store, &tokens(10)), None);
}

#[test]
fn g6_truncated_payload_is_rejected_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint("short-payload", 1, &tokens(10));
    let payload_path = {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(original.clone()).unwrap();
        store.payload_path(&original.meta.id, 1)
    };
    let bytes = std::fs::read(&payload_path).unwrap();
    std::fs::write(&payload_path, &bytes[..bytes.len() - 1]).unwrap();
    let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.rejected().len(), 1);
    assert!(
        store.rejected()[0].reason.contains("the manifest says"),
        "{:?}",
        store.rejected()
    );
    assert_eq!(store.stats().n_checkpoints, 0);
}

#[test]
fn g6_foreign_and_wrong_version_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ckpt-61.manifest"),
        b"this is not a manifest at all",
    )
    .unwrap();
    let mut other_version = bincode::serde::encode_to_vec(
        (*b"KVGATECK", MANIFEST_FORMAT_VERSION + 1),
        bincode::config::standard(),
    )
    .unwrap();
    other_version.extend_from_slice(&[0; 16]);
    std::fs::write(dir.path().join("ckpt-62.manifest"), other_version).unwrap();
    let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    let mut reasons: Vec<&str> = store.rejected().iter().map(|r| r.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2);
    let expected = format!(
        "format version {}, this build reads {MANIFEST_FORMAT_VERSION}",
        MANIFEST_FORMAT_VERSION + 1
    );
    assert!(reasons[0].contains(&expected), "{reasons:?}");
    assert!(reasons[1].contains("foreign file"), "{reasons:?}");
    assert_eq!(store.stats().n_checkpoints, 0);
}

#[test]
fn g6_hostile_manifest_length_cannot_exhaust_memory() {
    let dir = tempfile::tempdir().unwrap();
    // The id string claims 2^60 bytes (varint: 253 marks a u64), in a manifest whose own checksum is right.
    let mut body = vec![253];
    body.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let bytes = seal_manifest(MANIFEST_FORMAT_VERSION, &body).unwrap();
    std::fs::write(dir.path().join("ckpt-68.manifest"), bytes).unwrap();
    let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.rejected().len(), 1);
    assert!(
        store.rejected()[0].reason.contains("undecodable manifest"),
        "{:?}",
        store.rejected()
    );
}

#[test]
fn checkpoint_ids_cannot_escape_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut store = DiskStore::open(&store_dir, 1 << 20).unwrap();
    let hostile = checkpoint("../../etc/passwd", 1, &tokens(10));
    store.put(hostile.clone()).unwrap();
    let manifest = store.manifest_path(&hostile.meta.id);
    assert_eq!(manifest.parent(), Some(store_dir.as_path()));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the store directory"
    );
    assert_eq!(store.get(&hostile.meta.id).unwrap(), hostile);
    assert!(CheckpointId::new("").is_err());
    assert!(CheckpointId::new("a\nb").is_err());
    assert!(CheckpointId::new("x".repeat(101)).is_err());
}

#[test]
fn disk_store_evicts_to_capacity_and_supersedes_generations() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(dir.path(), 2 * TEN_TOKEN_BYTES).unwrap();
    store.put(checkpoint("a", 1, &tokens(10))).unwrap();
    store.put(checkpoint("b", 1, &[5; 10])).unwrap();
    let outcome = store.put(checkpoint("a", 2, &tokens(10))).unwrap();
    assert_eq!(outcome.superseded_generation, Some(1));
    assert!(
        !store
            .payload_path(&CheckpointId::new("a").unwrap(), 1)
            .exists()
    );
    let outcome = store.put(checkpoint("c", 1, &[6; 10])).unwrap();
    assert_eq!(outcome.evicted, vec![CheckpointId::new("b").unwrap()]);
    assert!(
        !store
            .manifest_path(&CheckpointId::new("b").unwrap())
            .exists()
    );
    assert!(store.remove(&CheckpointId::new("c").unwrap()).unwrap());
    drop(store);
    let mut store = DiskStore::open(dir.path(), 2 * TEN_TOKEN_BYTES).unwrap();
    assert_eq!(store.stats().n_checkpoints, 1);
    assert_eq!(
        store.get(&CheckpointId::new("a").unwrap()).unwrap(),
        checkpoint("a", 2, &tokens(10))
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        3,
        "the lock file, one manifest and one payload"
    );
}

#[test]
fn shared_store_handles_see_each_others_checkpoints() {
    use crate::store::SharedStore;
    let mut a = SharedStore::new(Box::new(HostStore::new(1 << 20)));
    let mut b = a.clone();
    assert_eq!(a.n_handles(), 2);
    a.put(checkpoint("from-a", 1, &tokens(10))).unwrap();
    assert_eq!(find(&mut b, &tokens(12)).as_deref(), Some("from-a"));
    let id = CheckpointId::new("from-a").unwrap();
    assert_eq!(b.get(&id).unwrap().meta.n_tokens, 10);
    assert_eq!(b.stats(), a.stats());
    assert!(b.remove(&id).unwrap());
    assert!(a.meta(&id).is_none());
}

/// A prefix's checkpoint id is its last block key's first 12 bytes in lower-case hex, a dash and its token
/// count, and a valid id whatever the count, the largest included.
#[test]
fn a_prefix_checkpoint_id_is_the_keys_first_twelve_bytes_in_hex_and_the_token_count() {
    let mut key = BlockKey([0; 32]);
    for (byte, value) in key
        .0
        .iter_mut()
        .zip((0u8..).map(|n| n.wrapping_mul(37).wrapping_add(5)))
    {
        *byte = value;
    }
    let hex: String = key.0[..12]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(
        CheckpointId::of_prefix(&key, 4096).as_str(),
        format!("{hex}-4096")
    );
    assert_eq!(
        CheckpointId::of_prefix(&BlockKey([0xff; 32]), 0).as_str(),
        "ffffffffffffffffffffffff-0"
    );
    for n_tokens in [0, 1, usize::MAX] {
        let id = CheckpointId::of_prefix(&key, n_tokens);
        assert_eq!(CheckpointId::new(id.as_str()).unwrap(), id);
    }
}

/// A checkpoint id is written as the text a `String` writes, so manifests from before the id became shared
/// text read back the same, in both directions.
#[test]
fn a_checkpoint_id_serializes_as_its_text() {
    let config = bincode::config::standard();
    for text in ["a", "0123456789ab-4096", &"x".repeat(100)] {
        let id = CheckpointId::new(text).unwrap();
        let as_id = bincode::serde::encode_to_vec(&id, config).unwrap();
        let as_string = bincode::serde::encode_to_vec(text, config).unwrap();
        assert_eq!(as_id, as_string);
        let (back, _): (CheckpointId, usize) =
            bincode::serde::decode_from_slice(&as_string, config).unwrap();
        assert_eq!(back, id);
        assert_eq!(back.as_str(), text);
    }
}

/// A page-aligned checkpoint's meta from its keys alone is the meta made from its tokens.
#[test]
fn a_block_aligned_meta_from_keys_alone_is_the_meta_from_tokens() {
    for n_tokens in [0, TOKENS_PER_PAGE, 5 * TOKENS_PER_PAGE] {
        let tokens = tokens(n_tokens);
        let keys = BlockKey::chain_all(&tokens, TOKENS_PER_PAGE as usize, b"salt");
        let id = CheckpointId::new("aligned").unwrap();
        let from_tokens = CheckpointMeta::full_attention_keyed(
            id.clone(),
            3,
            CheckpointKind::Response,
            &tokens,
            keys.clone(),
            layout(),
        );
        let from_keys =
            CheckpointMeta::full_attention_blocks(id, 3, CheckpointKind::Response, keys, layout());
        assert_eq!(from_keys, from_tokens);
    }
}
