//! Restore bandwidth: `ThreadedCopyEngine` restoring 2 MiB pages from store buffers into `HostStorage`
//! (`restore_host_gib_s`, one worker per core) against plain single-threaded memcpy of the same bytes in the
//! same run (`memcpy_gib_s`); target ratio >= 0.8. `restore_host_1worker_gib_s` is the same restore on one
//! worker thread, the like-for-like comparison with memcpy. With `--gpu`: 1 GiB restored from store buffers
//! in 16 jobs of 64 MiB through `CudaCopyEngine` (pinned staging, transfers and events, the engine's path)
//! against `cudaMemcpyAsync` of the same bytes from pinned memory (`restore_cuda_vs_pinned`, target 0.8);
//! without a driver it says it cannot run and why (`restore_cuda_skipped`).
//! Prints progress on stderr and one JSON object on stdout.
#![allow(clippy::disallowed_methods, reason = "a bench times itself")]
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark binary reports on stdout/stderr"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use checkpoint_transfer::{
    CopyEngine, CopyJob, CopyOutcome, CudaCopyEngine, PageBuf, ThreadedCopyEngine,
};
use kv_pool::Timestamp;
use kv_pool::{CudaStorage, HostStorage, PageId, PageStorage};

const BYTES_PER_PAGE: usize = 2 << 20;

fn gib_s(n_bytes: usize, elapsed: Duration) -> f64 {
    n_bytes as f64 / (1u64 << 30) as f64 / elapsed.as_secs_f64()
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn restore_job(sources: &[PageBuf]) -> CopyJob {
    CopyJob {
        rank: 0,
        pages: sources
            .iter()
            .enumerate()
            .map(|(idx, bytes)| (bytes.clone(), PageId(idx as u32 + 1)))
            .collect(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) run the quick sizes.
    let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
    let gpu = args.iter().any(|a| a == "--gpu");
    let (total_bytes, reps) = if quick { (64 << 20, 3) } else { (256 << 20, 7) };
    let n_pages = total_bytes / BYTES_PER_PAGE;
    let n_workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    eprintln!(
        "restore bench: {n_pages} pages of 2 MiB ({} MiB), {reps} reps, {n_workers} workers",
        total_bytes >> 20
    );

    let sources: Vec<PageBuf> = (0..n_pages)
        .map(|page| {
            (0..BYTES_PER_PAGE)
                .map(|i| (i ^ page) as u8)
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    let storage =
        Arc::new(HostStorage::new(1, n_pages as u32 + 1, BYTES_PER_PAGE).expect("host storage"));
    let mut copies =
        ThreadedCopyEngine::new(Arc::clone(&storage) as Arc<dyn PageStorage>, n_workers)
            .expect("copy workers");
    let mut one_worker = ThreadedCopyEngine::new(Arc::clone(&storage) as Arc<dyn PageStorage>, 1)
        .expect("copy worker");
    let mut memcpy_dst: Vec<Vec<u8>> = (0..n_pages).map(|_| vec![1u8; BYTES_PER_PAGE]).collect();

    let mut restore_samples = Vec::with_capacity(reps);
    let mut one_worker_samples = Vec::with_capacity(reps);
    let mut memcpy_samples = Vec::with_capacity(reps);
    // One warm-up round of each, then alternate so both see the same machine state.
    for rep in 0..=reps {
        let job = restore_job(&sources);
        let started = Instant::now();
        copies.submit(job, Timestamp::ZERO).expect("submit");
        let done = copies.wait_all();
        let restore_elapsed = started.elapsed();
        assert!(
            done.iter().all(|c| matches!(c.outcome, CopyOutcome::Done)),
            "restore failed: {done:?}"
        );

        let started = Instant::now();
        one_worker
            .submit(restore_job(&sources), Timestamp::ZERO)
            .expect("submit");
        let done = one_worker.wait_all();
        let one_worker_elapsed = started.elapsed();
        assert!(
            done.iter().all(|c| matches!(c.outcome, CopyOutcome::Done)),
            "restore failed: {done:?}"
        );

        let started = Instant::now();
        for (dst, src) in memcpy_dst.iter_mut().zip(&sources) {
            dst.copy_from_slice(src);
        }
        black_box(&mut memcpy_dst);
        let memcpy_elapsed = started.elapsed();
        if rep > 0 {
            restore_samples.push(gib_s(total_bytes, restore_elapsed));
            one_worker_samples.push(gib_s(total_bytes, one_worker_elapsed));
            memcpy_samples.push(gib_s(total_bytes, memcpy_elapsed));
        }
    }
    let last = storage
        .with_page(0, PageId(n_pages as u32), <[u8]>::to_vec)
        .expect("read back");
    assert_eq!(last[..], sources[n_pages - 1][..], "restored bytes differ");
    let restore_host_gib_s = median(restore_samples);
    let one_worker_gib_s = median(one_worker_samples);
    let memcpy_gib_s = median(memcpy_samples);
    let ratio = restore_host_gib_s / memcpy_gib_s;
    let one_worker_ratio = one_worker_gib_s / memcpy_gib_s;
    eprintln!(
        "restore_host {restore_host_gib_s:.2} GiB/s ({n_workers} workers), one worker {one_worker_gib_s:.2} GiB/s, \
         memcpy {memcpy_gib_s:.2} GiB/s, ratios {ratio:.2} and {one_worker_ratio:.2}"
    );
    let mut figures = format!(
        "\"restore_host_gib_s\":{restore_host_gib_s:.3},\"memcpy_gib_s\":{memcpy_gib_s:.3},\"restore_host_vs_memcpy\":{ratio:.3},\
         \"restore_host_1worker_gib_s\":{one_worker_gib_s:.3},\"restore_host_1worker_vs_memcpy\":{one_worker_ratio:.3}"
    );
    if gpu {
        match cuda_figures() {
            Ok(cuda) => {
                eprintln!(
                    "cuda restore {:.2} GiB/s against a pinned upload of the same {} MiB at {:.2} GiB/s: \
                     {:.2}x (target {CUDA_TARGET_RATIO}x: {})",
                    cuda.restore_gib_s,
                    cuda.n_bytes >> 20,
                    cuda.pinned_gib_s,
                    cuda.ratio(),
                    if cuda.ratio() >= CUDA_TARGET_RATIO {
                        "met"
                    } else {
                        "MISSED"
                    }
                );
                figures.push_str(&format!(
                    ",\"restore_cuda_gib_s\":{:.3},\"pinned_htod_gib_s\":{:.3},\"restore_cuda_vs_pinned\":{:.3},\
                     \"restore_cuda_target\":{CUDA_TARGET_RATIO},\"restore_cuda_bytes\":{}",
                    cuda.restore_gib_s,
                    cuda.pinned_gib_s,
                    cuda.ratio(),
                    cuda.n_bytes
                ));
            }
            Err(reason) => {
                eprintln!("cuda bandwidth: cannot run here, no figure: {reason}");
                figures.push_str(&format!(",\"restore_cuda_skipped\":{:?}", reason));
            }
        }
    }
    println!("{{{figures}}}");
}

/// The CUDA restore should reach this share of a plain pinned upload of the same bytes.
const CUDA_TARGET_RATIO: f64 = 0.8;
/// Pages of one restore job (64 MiB of 2 MiB pages: a 16k-token context of a 4 KiB-per-token model).
const CUDA_JOB_PAGES: usize = 32;
/// Jobs per measured round: 16 x 64 MiB = 1 GiB.
const CUDA_JOBS: usize = 16;
/// Measured rounds after one warm-up.
const CUDA_REPS: usize = 3;

struct CudaFigures {
    restore_gib_s: f64,
    pinned_gib_s: f64,
    n_bytes: usize,
}

impl CudaFigures {
    fn ratio(&self) -> f64 {
        self.restore_gib_s / self.pinned_gib_s
    }
}

/// Median GiB/s of `CUDA_JOBS` restore jobs of `CUDA_JOB_PAGES` pages through `CudaCopyEngine` (submitted
/// together, as an engine step would, staged through its bounded pinned pool), and of a pinned upload of
/// the same bytes in job-sized `cudaMemcpyAsync`s, alternating.
fn cuda_figures() -> Result<CudaFigures, String> {
    kv_pool::cuda_available()?;
    let n_pages = CUDA_JOB_PAGES * CUDA_JOBS;
    let n_bytes = n_pages * BYTES_PER_PAGE;
    let storage = Arc::new(
        CudaStorage::new(0, 1, n_pages as u32 + 1, BYTES_PER_PAGE).map_err(|e| e.to_string())?,
    );
    let mut copies = CudaCopyEngine::new(Arc::clone(&storage)).map_err(|e| e.to_string())?;
    let sources: Vec<PageBuf> = (0..CUDA_JOB_PAGES)
        .map(|page| vec![page as u8 ^ 0x3C; BYTES_PER_PAGE].into())
        .collect();
    let jobs = || {
        (0..CUDA_JOBS).map(|job| CopyJob {
            rank: 0,
            pages: (0..CUDA_JOB_PAGES)
                .map(|idx| {
                    let page = PageId((job * CUDA_JOB_PAGES + idx) as u32 + 1);
                    (sources[idx].clone(), page)
                })
                .collect(),
        })
    };
    let (mut restore, mut pinned) = (Vec::new(), Vec::new());
    for rep in 0..=CUDA_REPS {
        let started = Instant::now();
        for job in jobs() {
            copies
                .submit(job, Timestamp::ZERO)
                .map_err(|e| e.to_string())?;
        }
        let done = copies.wait_all();
        let elapsed = started.elapsed();
        if let Some(failed) = done.iter().find(|c| c.outcome != CopyOutcome::Done) {
            return Err(format!("cuda restore failed: {failed:?}"));
        }
        if done.len() != CUDA_JOBS {
            return Err(format!(
                "{} of {CUDA_JOBS} restore jobs finished",
                done.len()
            ));
        }
        let mut back = vec![0u8; BYTES_PER_PAGE];
        storage
            .read(0, PageId(n_pages as u32), &mut back)
            .map_err(|e| e.to_string())?;
        if back[..] != sources[CUDA_JOB_PAGES - 1][..] {
            return Err("cuda restored bytes differ".to_string());
        }
        let (upload, moved) = copies
            .time_pinned_upload(0, PageId(1), CUDA_JOB_PAGES as u32, n_bytes)
            .map_err(|e| e.to_string())?;
        if rep > 0 {
            restore.push(gib_s(n_bytes, elapsed));
            pinned.push(gib_s(moved, upload));
        }
    }
    Ok(CudaFigures {
        restore_gib_s: median(restore),
        pinned_gib_s: median(pinned),
        n_bytes,
    })
}
