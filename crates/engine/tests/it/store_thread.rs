//! Issue 28 item 4: on the wall clock the checkpoint store runs on a thread of its own, so a store that does
//! not answer delays the restore that asked it (which falls back after the lookup timeout, G2) and never a
//! step: a request that needs no store finishes while the store is still stuck.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkpoint_transfer::{
    Checkpoint, CheckpointId, CheckpointMeta, CheckpointStore, HostStore, PrefixQuery, PutOutcome,
    StoreStats,
};
use engine::{ClockKind, Engine, FallbackReason, FinishedRequest};
use kv_pool::{RequestId, Timestamp};

use crate::contract::spec;

/// A host store whose lookups block until `release_at`, recording when it first answered one.
#[derive(Debug)]
struct StuckStore {
    inner: HostStore,
    release_at: Instant,
    first_answer: Arc<Mutex<Option<Instant>>>,
}

impl StuckStore {
    fn wait(&self) {
        let now = Instant::now();
        if now < self.release_at {
            std::thread::sleep(self.release_at - now);
        }
        let mut first = self.first_answer.lock().unwrap();
        first.get_or_insert_with(Instant::now);
    }
}

impl CheckpointStore for StuckStore {
    fn find_longest(&mut self, query: &PrefixQuery<'_>) -> Option<Arc<CheckpointMeta>> {
        self.wait();
        self.inner.find_longest(query)
    }
    fn find_longest_prefix(
        &mut self,
        query: &PrefixQuery<'_>,
    ) -> Option<(Arc<CheckpointMeta>, u32)> {
        self.wait();
        self.inner.find_longest_prefix(query)
    }
    fn put(&mut self, checkpoint: Checkpoint) -> checkpoint_transfer::Result<PutOutcome> {
        self.inner.put(checkpoint)
    }
    fn get(&mut self, id: &CheckpointId) -> checkpoint_transfer::Result<Checkpoint> {
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

#[test]
fn g2_a_stuck_store_delays_only_the_restore_that_asked_it_never_a_step_on_the_wall_clock() {
    const STUCK: Duration = Duration::from_secs(3);
    let first_answer = Arc::new(Mutex::new(None));
    let store = StuckStore {
        inner: HostStore::new(1 << 30),
        release_at: Instant::now() + STUCK,
        first_answer: Arc::clone(&first_answer),
    };
    let params = engine::EngineParams {
        clock: ClockKind::Wall,
        lookup_timeout: Duration::from_millis(300),
        ..crate::verified_defaults()
    };
    let mut engine = Engine::builder(params)
        .store(Box::new(store))
        .build()
        .unwrap();
    // Request 1 has whole blocks to restore, so it asks the store; request 2 is shorter than a block and
    // asks nothing.
    engine
        .submit(spec(1, (0..64).collect(), 4, Timestamp::ZERO))
        .unwrap();
    engine
        .submit(spec(2, (1000..1008).collect(), 4, Timestamp::ZERO))
        .unwrap();
    let started = Instant::now();
    let mut finished: Vec<(FinishedRequest, Instant)> = Vec::new();
    while finished.len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the requests never finished"
        );
        engine.step().unwrap();
        engine.check_invariants().unwrap();
        let now = Instant::now();
        finished.extend(engine.take_finished().into_iter().map(|done| (done, now)));
    }
    let first_answer = *first_answer.lock().unwrap();
    let by_id = |id: u64| {
        finished
            .iter()
            .find(|(done, _)| done.id == RequestId(id))
            .expect("finished")
    };
    let (cold, cold_at) = by_id(2);
    assert!(!cold.cancelled && cold.metrics.fallback.is_none());
    assert!(
        first_answer.is_none_or(|answered| *cold_at < answered),
        "the request that asked no store finished only after the store answered: a step waited for it"
    );
    let (restore, _) = by_id(1);
    assert_eq!(
        restore.metrics.fallback,
        Some(FallbackReason::LookupTimeout)
    );
    assert!(!restore.cancelled);
    assert_eq!(restore.metrics.prompt_tokens_restored, 0);
}
