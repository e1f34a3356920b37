//! `FakeDevice`: a host-backed stand-in for the CUDA driver behind `Device`, so the CUDA path's logic
//! (ordering, staging, error paths, drain-before-release) runs in CI without a GPU. Each rank's copy stream
//! is a thread that executes queued transfers in order, after an injected delay each, and reads the pinned
//! source bytes only when it executes them, as a device does. Tests pause a stream, or hold it at a queued
//! step as on the real driver (`Device::hold_stream`), to keep copies in flight,
//! inject failures (a refused enqueue or record, a failed query or synchronization, a transfer that fails
//! and leaves its stream failed until `recover`), and read the violations it saw: pinned bytes refilled or
//! freed while a queued transfer still reads them, an arena range read or written while a queued transfer
//! still writes it. It counts transfers and pinned bytes so tests can check batching and the staging bound.
#![allow(
    unsafe_code,
    reason = "implements `Device::enqueue_htod`, an unsafe method; the stand-in itself uses no unsafe block"
)]

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shape;
use super::device::{Device, DeviceStorage, Gate, StreamHold};
use crate::error::Result;

/// A failure `FakeDevice::inject` arms; each fires once, on the next call of its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeFault {
    /// The next `enqueue_htod` is refused (nothing queued).
    Enqueue,
    /// The next `record` is refused.
    Record,
    /// The next `query` fails.
    Query,
    /// The next `wait` or `synchronize` fails.
    Sync,
    /// The next `record` panics, after the transfers before it were queued: a bug below the copy engine,
    /// which must become that copy's failure, never a hang or staging freed under a transfer.
    Panic,
    /// The next transfer executed fails: its stream stays failed (queries, waits and synchronizations fail,
    /// nothing more executes) until `recover`.
    Transfer,
}

impl std::fmt::Debug for FakeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeDevice")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for FakePinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakePinned")
            .field("readers", &self.readers)
            .finish_non_exhaustive()
    }
}

/// A host-backed stand-in for a CUDA device: `n_ranks` arenas, one copy stream thread per rank.
pub struct FakeDevice {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// What the stand-in counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeStats {
    /// Host-to-device transfers executed.
    pub transfers: u64,
    /// Device-to-host reads (`Device::read`), each one transfer.
    pub reads: u64,
    /// Synchronous host-to-device writes (`Device::write`, `Device::write_padded`), each one transfer.
    pub writes: u64,
    /// Bytes those writes moved from the host (a padded write's zeros are made on the device).
    pub write_bytes: u64,
    /// Pinned bytes allocated and not yet freed.
    pub pinned_live_bytes: usize,
    /// The most pinned bytes live at once.
    pub pinned_peak_bytes: usize,
}

/// Pinned memory of the stand-in: shared with the stream threads that read it.
pub struct FakePinned {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Queued transfers that will still read it.
    readers: Arc<AtomicUsize>,
    shared: Arc<Shared>,
}

/// An event of the stand-in: completes when its stream executes it.
#[derive(Debug)]
pub struct FakeEvent {
    rank: u32,
    done: Arc<AtomicBool>,
}

enum Op {
    Htod {
        bytes: Arc<Mutex<Vec<u8>>>,
        readers: Arc<AtomicUsize>,
        src: Range<usize>,
        dst_offset: usize,
        id: u64,
    },
    Record(Arc<AtomicBool>),
    /// A held stream: nothing after it executes until the gate opens.
    Hold(Arc<Gate>),
}

#[derive(Default)]
struct Stream {
    queue: VecDeque<Op>,
    /// An operation taken off the queue and not finished yet.
    busy: bool,
    paused: bool,
    failed: Option<String>,
    shutdown: bool,
}

/// A queued transfer's id and the arena bytes it will write.
type QueuedWrite = (u64, Range<usize>);

struct Shared {
    arenas: Vec<Mutex<Vec<u8>>>,
    streams: Vec<(Mutex<Stream>, Condvar)>,
    /// Per rank: the arena ranges queued transfers will write, by transfer id.
    queued_writes: Vec<Mutex<Vec<QueuedWrite>>>,
    faults: Mutex<Vec<FakeFault>>,
    /// The gates of holds not released yet, opened when the device is dropped.
    holds: Mutex<Vec<Weak<Gate>>>,
    violations: Mutex<Vec<String>>,
    delay_us: AtomicU64,
    next_id: AtomicU64,
    transfers: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    pinned_live: AtomicUsize,
    pinned_peak: AtomicUsize,
}

impl DeviceStorage<FakeDevice> {
    /// Storage on a new stand-in device of `n_ranks` shards of `n_pages` pages of `bytes_per_page` bytes.
    /// Errors: `EmptyStorage` / `StorageTooLarge` for a bad shape.
    pub fn fake(n_ranks: u32, n_pages: u32, bytes_per_page: usize) -> Result<Self> {
        let shape = Shape::new(n_ranks, n_pages, bytes_per_page)?;
        Ok(DeviceStorage::from_device(shape, FakeDevice::new(shape)))
    }
}

impl FakeDevice {
    fn new(shape: Shape) -> FakeDevice {
        let n_ranks = shape.n_ranks as usize;
        let shared = Arc::new(Shared {
            arenas: (0..n_ranks)
                .map(|_| Mutex::new(vec![0; shape.bytes_per_shard()]))
                .collect(),
            streams: (0..n_ranks)
                .map(|_| (Mutex::new(Stream::default()), Condvar::new()))
                .collect(),
            queued_writes: (0..n_ranks).map(|_| Mutex::new(Vec::new())).collect(),
            faults: Mutex::new(Vec::new()),
            holds: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            delay_us: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            transfers: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            pinned_live: AtomicUsize::new(0),
            pinned_peak: AtomicUsize::new(0),
        });
        let threads = (0..shape.n_ranks)
            .map(|rank| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || run_stream(&shared, rank))
            })
            .collect();
        FakeDevice { shared, threads }
    }

    /// Every transfer waits `delay` before it executes.
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(micros, Ordering::Relaxed);
    }

    /// Stops (`true`) or restarts `rank`'s stream: nothing queued on it executes while it is paused.
    pub fn pause(&self, rank: u32, paused: bool) {
        if let Some((stream, changed)) = self.shared.streams.get(rank as usize) {
            lock(stream).paused = paused;
            changed.notify_all();
        }
    }

    /// Arms `fault`: it fires once, on the next call of its kind.
    pub fn inject(&self, fault: FakeFault) {
        lock(&self.shared.faults).push(fault);
    }

    /// Clears a failed stream of `rank` (`FakeFault::Transfer`): what it still holds executes.
    pub fn recover(&self, rank: u32) {
        if let Some((stream, changed)) = self.shared.streams.get(rank as usize) {
            lock(stream).failed = None;
            changed.notify_all();
        }
    }

    /// Operations queued on `rank`'s stream and not yet executed.
    pub fn n_queued(&self, rank: u32) -> usize {
        self.shared.streams.get(rank as usize).map_or(0, |(s, _)| {
            let stream = lock(s);
            stream.queue.len() + usize::from(stream.busy)
        })
    }

    /// What the stand-in counted so far.
    pub fn stats(&self) -> FakeStats {
        FakeStats {
            transfers: self.shared.transfers.load(Ordering::Relaxed),
            reads: self.shared.reads.load(Ordering::Relaxed),
            writes: self.shared.writes.load(Ordering::Relaxed),
            write_bytes: self.shared.write_bytes.load(Ordering::Relaxed),
            pinned_live_bytes: self.shared.pinned_live.load(Ordering::Relaxed),
            pinned_peak_bytes: self.shared.pinned_peak.load(Ordering::Relaxed),
        }
    }

    /// Ordering violations seen so far (none in a correct copy engine).
    pub fn violations(&self) -> Vec<String> {
        lock(&self.shared.violations).clone()
    }

    fn stream(&self, rank: u32) -> Result<&(Mutex<Stream>, Condvar), String> {
        self.shared
            .streams
            .get(rank as usize)
            .ok_or_else(|| format!("no stream for rank {rank}"))
    }

    /// Blocks until `until` holds of `rank`'s stream, or fails when the stream failed.
    fn block_on(&self, rank: u32, until: impl Fn(&Stream) -> bool) -> Result<(), String> {
        self.shared.fire(FakeFault::Sync)?;
        let (stream, changed) = self.stream(rank)?;
        let mut state = lock(stream);
        loop {
            if until(&state) {
                return Ok(());
            }
            if let Some(reason) = &state.failed {
                return Err(reason.clone());
            }
            if state.shutdown {
                return Err("the device is shut down".to_string());
            }
            state = changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Notes a violation when `range` of `rank`'s arena is written by a queued transfer.
    fn check_not_queued(&self, rank: u32, range: &Range<usize>, what: &str) {
        let Some(queued) = self.shared.queued_writes.get(rank as usize) else {
            return;
        };
        let clash = lock(queued)
            .iter()
            .any(|(_, q)| q.start < range.end && range.start < q.end);
        if clash {
            self.shared.violation(format!(
                "{what} of bytes {range:?} of rank {rank} while a queued transfer writes them"
            ));
        }
    }

    fn arena(&self, rank: u32) -> Result<MutexGuard<'_, Vec<u8>>, String> {
        self.shared
            .arenas
            .get(rank as usize)
            .map(lock)
            .ok_or_else(|| format!("no arena for rank {rank}"))
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        for (stream, changed) in &self.shared.streams {
            lock(stream).shutdown = true;
            changed.notify_all();
        }
        for gate in lock(&self.shared.holds).drain(..) {
            if let Some(gate) = gate.upgrade() {
                gate.open();
            }
        }
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                self.shared
                    .violation("a stream thread panicked".to_string());
            }
        }
    }
}

impl Device for FakeDevice {
    type Pinned = FakePinned;
    type Event = FakeEvent;

    fn alloc_pinned(&self, n_bytes: usize) -> Result<FakePinned, String> {
        let live = self
            .shared
            .pinned_live
            .fetch_add(n_bytes, Ordering::Relaxed)
            + n_bytes;
        self.shared.pinned_peak.fetch_max(live, Ordering::Relaxed);
        Ok(FakePinned {
            bytes: Arc::new(Mutex::new(vec![0; n_bytes])),
            readers: Arc::new(AtomicUsize::new(0)),
            shared: Arc::clone(&self.shared),
        })
    }

    fn pinned_len(&self, pinned: &FakePinned) -> usize {
        lock(&pinned.bytes).len()
    }

    fn fill_pinned(
        &self,
        pinned: &mut FakePinned,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), String> {
        if pinned.readers.load(Ordering::Acquire) > 0 {
            self.shared
                .violation("pinned staging refilled while a queued transfer reads it".to_string());
        }
        fill(&mut lock(&pinned.bytes));
        Ok(())
    }

    unsafe fn enqueue_htod(
        &self,
        rank: u32,
        dst_offset: usize,
        pinned: &FakePinned,
        src: Range<usize>,
    ) -> Result<(), String> {
        self.shared.fire(FakeFault::Enqueue)?;
        let n_bytes = src.end.saturating_sub(src.start);
        let dst = dst_offset..dst_offset.saturating_add(n_bytes);
        let arena_len = self.arena(rank)?.len();
        if src.end > self.pinned_len(pinned) || dst.end > arena_len || src.start > src.end {
            return Err(format!("transfer {src:?} -> {dst:?} out of bounds"));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(queued) = self.shared.queued_writes.get(rank as usize) {
            lock(queued).push((id, dst));
        }
        pinned.readers.fetch_add(1, Ordering::AcqRel);
        let op = Op::Htod {
            bytes: Arc::clone(&pinned.bytes),
            readers: Arc::clone(&pinned.readers),
            src,
            dst_offset,
            id,
        };
        let (stream, changed) = self.stream(rank)?;
        lock(stream).queue.push_back(op);
        changed.notify_all();
        Ok(())
    }

    fn record(&self, rank: u32) -> Result<FakeEvent, String> {
        self.shared.fire(FakeFault::Record)?;
        if self.shared.fire(FakeFault::Panic).is_err() {
            std::panic::panic_any("injected fault: Panic");
        }
        let done = Arc::new(AtomicBool::new(false));
        let (stream, changed) = self.stream(rank)?;
        lock(stream).queue.push_back(Op::Record(Arc::clone(&done)));
        changed.notify_all();
        Ok(FakeEvent { rank, done })
    }

    fn hold_stream(&self, rank: u32) -> Result<StreamHold, String> {
        let (stream, changed) = self.stream(rank)?;
        let (hold, gate) = StreamHold::new();
        let mut holds = lock(&self.shared.holds);
        holds.retain(|gate| gate.strong_count() > 0);
        holds.push(Arc::downgrade(&gate));
        lock(stream).queue.push_back(Op::Hold(gate));
        changed.notify_all();
        Ok(hold)
    }

    fn query(&self, event: &FakeEvent) -> Result<bool, String> {
        self.shared.fire(FakeFault::Query)?;
        if event.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        match &lock(&self.stream(event.rank)?.0).failed {
            Some(reason) => Err(reason.clone()),
            None => Ok(false),
        }
    }

    fn wait(&self, event: &FakeEvent) -> Result<(), String> {
        self.block_on(event.rank, |_| event.done.load(Ordering::Acquire))
    }

    fn synchronize(&self, rank: u32) -> Result<(), String> {
        self.block_on(rank, |stream| stream.queue.is_empty() && !stream.busy)
    }

    fn read(&self, rank: u32, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        self.shared.reads.fetch_add(1, Ordering::Relaxed);
        let range = offset..offset.saturating_add(dst.len());
        self.check_not_queued(rank, &range, "a read");
        let arena = self.arena(rank)?;
        let src = arena.get(range).ok_or("read out of bounds")?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn write(&self, rank: u32, offset: usize, src: &[u8]) -> Result<(), String> {
        self.write_padded(rank, offset, src, src.len())
    }

    fn write_padded(
        &self,
        rank: u32,
        offset: usize,
        src: &[u8],
        n_bytes: usize,
    ) -> Result<(), String> {
        if n_bytes < src.len() {
            return Err(format!("{} bytes padded to {n_bytes}", src.len()));
        }
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        self.shared
            .write_bytes
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        let range = offset..offset.saturating_add(n_bytes);
        self.check_not_queued(rank, &range, "a write");
        let mut arena = self.arena(rank)?;
        let (head, tail) = arena
            .get_mut(range)
            .ok_or("write out of bounds")?
            .split_at_mut(src.len());
        head.copy_from_slice(src);
        tail.fill(0);
        Ok(())
    }

    fn copy_within(
        &self,
        rank: u32,
        src_offset: usize,
        dst_offset: usize,
        n_bytes: usize,
    ) -> Result<(), String> {
        let src = src_offset..src_offset.saturating_add(n_bytes);
        let dst = dst_offset..dst_offset.saturating_add(n_bytes);
        self.check_not_queued(rank, &src, "a copy");
        self.check_not_queued(rank, &dst, "a copy");
        let mut arena = self.arena(rank)?;
        if src.end > arena.len() || dst.end > arena.len() {
            return Err("copy out of bounds".to_string());
        }
        arena.copy_within(src, dst_offset);
        Ok(())
    }
}

impl Drop for FakePinned {
    fn drop(&mut self) {
        if self.readers.load(Ordering::Acquire) > 0 {
            self.shared
                .violation("pinned staging freed while a queued transfer reads it".to_string());
        }
        let len = lock(&self.bytes).len();
        self.shared.pinned_live.fetch_sub(len, Ordering::Relaxed);
    }
}

impl Shared {
    fn violation(&self, what: String) {
        lock(&self.violations).push(what);
    }

    /// Fails with an injected fault of `kind` if one is armed, disarming it.
    fn fire(&self, kind: FakeFault) -> Result<(), String> {
        let mut faults = lock(&self.faults);
        match faults.iter().position(|&f| f == kind) {
            Some(idx) => {
                faults.remove(idx);
                Err(format!("injected fault: {kind:?}"))
            }
            None => Ok(()),
        }
    }
}

/// A stream thread: executes `rank`'s queue in order until the device is dropped.
fn run_stream(shared: &Shared, rank: u32) {
    let Some((stream, changed)) = shared.streams.get(rank as usize) else {
        return;
    };
    loop {
        let op = {
            let mut state = lock(stream);
            loop {
                if state.shutdown {
                    return;
                }
                if !state.paused
                    && state.failed.is_none()
                    && let Some(op) = state.queue.pop_front()
                {
                    state.busy = true;
                    break op;
                }
                state = changed.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let failure = execute(shared, rank, op);
        let mut state = lock(stream);
        state.busy = false;
        if failure.is_some() {
            state.failed = failure;
        }
        changed.notify_all();
    }
}

/// Executes one operation; a transfer failure is the stream's new failure.
fn execute(shared: &Shared, rank: u32, op: Op) -> Option<String> {
    match op {
        Op::Record(done) => {
            done.store(true, Ordering::Release);
            None
        }
        Op::Hold(gate) => {
            gate.pass();
            None
        }
        Op::Htod {
            bytes,
            readers,
            src,
            dst_offset,
            id,
        } => {
            let delay = shared.delay_us.load(Ordering::Relaxed);
            if delay > 0 {
                std::thread::sleep(Duration::from_micros(delay));
            }
            let failure = shared.fire(FakeFault::Transfer).err();
            if failure.is_none() {
                copy_into_arena(shared, rank, &bytes, src, dst_offset);
                shared.transfers.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(queued) = shared.queued_writes.get(rank as usize) {
                lock(queued).retain(|(q, _)| *q != id);
            }
            readers.fetch_sub(1, Ordering::AcqRel);
            failure
        }
    }
}

fn copy_into_arena(
    shared: &Shared,
    rank: u32,
    bytes: &Mutex<Vec<u8>>,
    src: Range<usize>,
    dst_offset: usize,
) {
    let Some(arena) = shared.arenas.get(rank as usize) else {
        return;
    };
    let dst = dst_offset..dst_offset + (src.end - src.start);
    let source = lock(bytes);
    let mut arena = lock(arena);
    if let (Some(from), Some(to)) = (source.get(src), arena.get_mut(dst)) {
        to.copy_from_slice(from);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
