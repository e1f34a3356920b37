//! Issue 28 item 4: on the wall clock the checkpoint store runs on a thread of its own, so a store that does
//! not answer delays the restore that asked it (which falls back after the lookup timeout, G2) and never a
//! step: a request that needs no store finishes while the store is still stuck, whether it is stuck in a
//! lookup or in reading a found checkpoint's pages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkpoint_transfer::{
    Checkpoint, CheckpointId, CheckpointMeta, CheckpointStore, HostStore, PrefixQuery, PutOutcome,
    StoreStats,
};
use engine::{ClockKind, Engine, FallbackReason, FinishedRequest, Policy};
use kv_pool::{RequestId, Timestamp};

use crate::contract::spec;

type Shared<T> = Arc<Mutex<T>>;

/// A host store whose lookups (or, with `stuck_reads`, whose page reads) block until `release_at`,
/// recording when it first answered one.
#[derive(Debug)]
struct StuckStore {
    inner: HostStore,
    release_at: Arc<Mutex<Instant>>,
    stuck_reads: bool,
    first_answer: Arc<Mutex<Option<Instant>>>,
}

impl StuckStore {
    /// The store, when it is released, and when it first answered.
    fn new(stuck_reads: bool) -> (StuckStore, Shared<Instant>, Shared<Option<Instant>>) {
        let release_at = Arc::new(Mutex::new(Instant::now()));
        let first_answer = Arc::new(Mutex::new(None));
        let store = StuckStore {
            inner: HostStore::new(1 << 30),
            release_at: Arc::clone(&release_at),
            stuck_reads,
            first_answer: Arc::clone(&first_answer),
        };
        (store, release_at, first_answer)
    }

    fn wait(&self) {
        let release_at = *self.release_at.lock().unwrap();
        let now = Instant::now();
        if now < release_at {
            std::thread::sleep(release_at - now);
            let mut first = self.first_answer.lock().unwrap();
            first.get_or_insert_with(Instant::now);
        }
    }
}

impl CheckpointStore for StuckStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        if !self.stuck_reads {
            self.wait();
        }
        self.inner.find_longest(query)
    }
    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        if !self.stuck_reads {
            self.wait();
        }
        self.inner.find_longest_prefix(query)
    }
    fn put(&mut self, checkpoint: Checkpoint) -> checkpoint_transfer::Result<PutOutcome> {
        self.inner.put(checkpoint)
    }
    fn get(&mut self, id: &CheckpointId) -> checkpoint_transfer::Result<Checkpoint> {
        if self.stuck_reads {
            self.wait();
        }
        self.inner.get(id)
    }
    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.inner.meta(id)
    }
    fn remove(&mut self, id: &CheckpointId) -> checkpoint_transfer::Result<bool> {
        self.inner.remove(id)
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

const STUCK: Duration = Duration::from_secs(3);

fn wall_engine(store: StuckStore, policy: Policy) -> Engine {
    let params = engine::EngineParams {
        clock: ClockKind::Wall,
        lookup_timeout: Duration::from_millis(300),
        policy,
        ..crate::verified_defaults()
    };
    Engine::builder(params)
        .store(Box::new(store))
        .build()
        .unwrap()
}

/// Steps until requests `restore` and `cold` finished; each with the instant it was seen finished.
fn run_both(engine: &mut Engine, restore: u64, cold: u64) -> [(FinishedRequest, Instant); 2] {
    let started = Instant::now();
    let mut finished: Vec<(FinishedRequest, Instant)> = Vec::new();
    let done = |finished: &[(FinishedRequest, Instant)], id| {
        finished.iter().any(|(f, _)| f.id == RequestId(id))
    };
    while !(done(&finished, restore) && done(&finished, cold)) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the requests never finished"
        );
        engine.step().unwrap();
        engine.check_invariants().unwrap();
        let now = Instant::now();
        finished.extend(engine.take_finished().into_iter().map(|done| (done, now)));
    }
    let mut take = |id| {
        let at = finished
            .iter()
            .position(|(f, _)| f.id == RequestId(id))
            .unwrap();
        finished.swap_remove(at)
    };
    [take(restore), take(cold)]
}

/// The cold request finished before the store answered anything, and the restore recomputed after its
/// lookup timeout.
fn check(
    [(restore, _), (cold, cold_at)]: &[(FinishedRequest, Instant); 2],
    first_answer: &Mutex<Option<Instant>>,
) {
    let first_answer = *first_answer.lock().unwrap();
    assert!(!cold.cancelled && cold.metrics.fallback.is_none());
    assert!(
        first_answer.is_none_or(|answered| *cold_at < answered),
        "the request that asked no store finished only after the store answered: a step waited for it"
    );
    assert_eq!(
        restore.metrics.fallback,
        Some(FallbackReason::LookupTimeout)
    );
    assert!(!restore.cancelled);
    assert_eq!(restore.metrics.prompt_tokens_restored, 0);
}

#[test]
fn g2_a_stuck_store_delays_only_the_restore_that_asked_it_never_a_step_on_the_wall_clock() {
    let (store, release_at, first_answer) = StuckStore::new(false);
    *release_at.lock().unwrap() = Instant::now() + STUCK;
    let mut engine = wall_engine(store, Policy::Reserved);
    // Request 1 has whole blocks to restore, so it asks the store; request 2 is shorter than a block and
    // asks nothing.
    engine
        .submit(spec(1, (0..64).collect(), 4, Timestamp::ZERO))
        .unwrap();
    engine
        .submit(spec(2, (1000..1008).collect(), 4, Timestamp::ZERO))
        .unwrap();
    check(&run_both(&mut engine, 1, 2), &first_answer);
}

/// The pages of a checkpoint found are read ahead off the step: a store stuck reading them delays that
/// restore only, whether it is reserved (the coordinator) or restored at admission (`ordinary`,
/// `pages-only`); once it reads again, the read ahead restores.
#[test]
fn g2_a_store_stuck_reading_pages_delays_only_that_restore_under_every_policy() {
    for policy in [Policy::Ordinary, Policy::PagesOnly, Policy::Reserved] {
        let (store, release_at, first_answer) = StuckStore::new(true);
        let mut engine = wall_engine(store, policy);
        let prompt: Vec<u32> = (0..64).collect();
        let _output = crate::contract::seed_checkpoint(&mut engine, 1, &prompt, 4);
        // The checkpoint is in the store; from now on reading its pages is stuck.
        *release_at.lock().unwrap() = Instant::now() + STUCK;
        let now = engine.now();
        engine.submit(spec(3, prompt.clone(), 4, now)).unwrap();
        engine
            .submit(spec(4, (1000..1008).collect(), 4, now))
            .unwrap();
        check(&run_both(&mut engine, 3, 4), &first_answer);
        // Once the store reads again, the same prompt is restored from it through the read ahead.
        let release = *release_at.lock().unwrap();
        std::thread::sleep(release.saturating_duration_since(Instant::now()));
        engine.reset_prefix_cache().unwrap();
        let now = engine.now();
        engine.submit(spec(5, prompt.clone(), 4, now)).unwrap();
        engine
            .submit(spec(6, (2000..2008).collect(), 4, now))
            .unwrap();
        let [(restored, _), _] = run_both(&mut engine, 5, 6);
        assert!(
            restored.metrics.fallback.is_none(),
            "{policy:?}: {restored:?}"
        );
        assert_eq!(restored.metrics.prompt_tokens_restored, 48, "{policy:?}");
    }
}
