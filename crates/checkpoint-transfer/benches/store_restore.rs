//! Restore bandwidth from a store tier: `CheckpointStore::get` of one checkpoint of 2 MiB pages (for the Redis
//! store: the transfer over loopback and the BLAKE3 check of every page), then its pages copied into
//! `HostStorage` by `ThreadedCopyEngine`, from a `RedisStore` on a `redis-server` this bench starts on a free
//! loopback port (`restore_redis_gib_s`) against the same from a `HostStore` (`restore_host_store_gib_s`) in
//! the same run. Without `redis-server` it prints that the Redis figure was skipped. Progress on stderr, one
//! JSON object on stdout. Without `--bench` (as `cargo test` runs it) it runs the `--quick` sizes.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::disallowed_methods,
    reason = "a benchmark binary reports on stdout/stderr and times itself"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkpoint_transfer::DEFAULT_KEY_PREFIX;
use checkpoint_transfer::{
    Checkpoint, CheckpointId, CheckpointKind, CheckpointMeta, CheckpointPayload, CheckpointStore,
    CopyEngine, CopyJob, CopyOutcome, HostStore, LayoutDescriptor, RankPages, RedisStore,
    ThreadedCopyEngine,
};
use kv_pool::Timestamp;
use kv_pool::{HostStorage, PageId, PageStorage};

#[allow(dead_code, reason = "the bench uses part of the shared test helper")]
#[path = "../../../tests/support/redis_server.rs"]
mod redis_server;

const BYTES_PER_PAGE: usize = 2 << 20;
const TOKENS_PER_PAGE: u32 = 16;

fn main() {
    // `cargo test` runs this binary without `--bench`: a quick smoke run there.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
    let (total_bytes, reps) = if quick { (64 << 20, 3) } else { (256 << 20, 7) };
    let n_pages = total_bytes / BYTES_PER_PAGE;
    eprintln!(
        "store restore bench: one checkpoint of {n_pages} pages of 2 MiB ({} MiB), {reps} reps",
        total_bytes >> 20
    );
    let checkpoint = checkpoint(n_pages);
    let storage =
        Arc::new(HostStorage::new(1, n_pages as u32 + 1, BYTES_PER_PAGE).expect("host storage"));
    let n_workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    let mut copies =
        ThreadedCopyEngine::new(Arc::clone(&storage) as Arc<dyn PageStorage>, n_workers)
            .expect("copy workers");
    let mut host = HostStore::new(u64::MAX);
    host.put(checkpoint.clone()).expect("host put");
    let host_gib_s = restore_gib_s(&mut host, &checkpoint, &mut copies, reps);
    eprintln!("restore from the host store {host_gib_s:.2} GiB/s");
    let mut figures = format!("\"restore_host_store_gib_s\":{host_gib_s:.3}");
    match redis_server::RedisServer::start("store_restore bench (restore_redis_gib_s)") {
        Some(server) => {
            let mut redis = RedisStore::open(
                &server.url(),
                DEFAULT_KEY_PREFIX,
                u64::MAX,
                Duration::from_secs(30),
            )
            .expect("redis store");
            redis.put(checkpoint.clone()).expect("redis put");
            let redis_gib_s = restore_gib_s(&mut redis, &checkpoint, &mut copies, reps);
            let ratio = redis_gib_s / host_gib_s;
            eprintln!(
                "restore from redis on loopback {redis_gib_s:.2} GiB/s ({ratio:.3} of the host store)"
            );
            figures.push_str(&format!(
                ",\"restore_redis_gib_s\":{redis_gib_s:.3},\"restore_redis_vs_host_store\":{ratio:.3}"
            ));
        }
        None => eprintln!("note: restore_redis_gib_s omitted: no redis-server"),
    }
    println!("{{{figures}}}");
}

/// Median GiB/s of `get` plus the copy of every page into host storage, after one warm-up round.
fn restore_gib_s(
    store: &mut dyn CheckpointStore,
    checkpoint: &Checkpoint,
    copies: &mut ThreadedCopyEngine,
    reps: usize,
) -> f64 {
    let n_bytes = checkpoint.payload.n_bytes() as f64;
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let started = Instant::now();
        let read = store.get(&checkpoint.meta.id).expect("get");
        let job = CopyJob {
            rank: 0,
            pages: (0..read.payload.ranks[0].len())
                .filter_map(|idx| read.payload.ranks[0].page_buf(idx))
                .enumerate()
                .map(|(idx, bytes)| (bytes, PageId(idx as u32 + 1)))
                .collect(),
        };
        copies.submit(job, Timestamp::ZERO).expect("submit");
        let done = copies.wait_all();
        let elapsed = started.elapsed();
        assert!(
            done.iter().all(|c| matches!(c.outcome, CopyOutcome::Done)),
            "restore failed: {done:?}"
        );
        assert_eq!(read.payload, checkpoint.payload, "restored bytes differ");
        if rep > 0 {
            samples.push(n_bytes / elapsed.as_secs_f64() / f64::from(1u32 << 30));
        }
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn checkpoint(n_pages: usize) -> Checkpoint {
    let tokens: Vec<u32> = (0..n_pages as u32 * TOKENS_PER_PAGE).collect();
    let layout = LayoutDescriptor::single_full(BYTES_PER_PAGE as u64, TOKENS_PER_PAGE, 1);
    let meta = CheckpointMeta::full_attention(
        CheckpointId::new("bench").expect("id"),
        1,
        CheckpointKind::Prompt,
        &tokens,
        b"bench",
        layout,
    );
    let pages = (0..n_pages)
        .flat_map(|page| (0..BYTES_PER_PAGE).map(move |i| (i ^ page) as u8))
        .collect::<Vec<u8>>();
    let pages = RankPages::new(pages, BYTES_PER_PAGE);
    Checkpoint {
        meta,
        payload: CheckpointPayload { ranks: vec![pages] },
    }
}
