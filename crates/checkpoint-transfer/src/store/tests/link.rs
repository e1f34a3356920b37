//! `StoreLink`: inline answers at once; threaded, a lookup of a store that is stuck answers `None` at once
//! (the caller never waits), the answer comes at a later call, puts are queued in order before later lookups,
//! refused puts come back with their request, and a store that panics fails what it is asked, never hangs.
#![allow(
    clippy::disallowed_methods,
    reason = "the tests wait on the wall clock for a thread that works in real time"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kv_pool::{BlockKey, RequestId};

use super::{checkpoint, tokens};
use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, PrefixQuery};
use crate::error::{Error, Result};
use crate::store::{CheckpointStore, Found, HostStore, Lookup, PutOutcome, StoreLink, StoreStats};

/// A host store whose lookups wait while `stuck` is set, and which panics on a put of the id `"panic"`.
#[derive(Debug)]
struct Gate {
    inner: HostStore,
    stuck: Arc<AtomicBool>,
}

impl Gate {
    fn wait(&self) {
        while self.stuck.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl CheckpointStore for Gate {
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
    fn put(&mut self, checkpoint: Checkpoint) -> Result<PutOutcome> {
        assert_ne!(checkpoint.meta.id.as_str(), "panic", "a store that panics");
        self.inner.put(checkpoint)
    }
    fn get(&mut self, id: &CheckpointId) -> Result<Checkpoint> {
        self.inner.get(id)
    }
    fn meta(&self, id: &CheckpointId) -> Option<Arc<CheckpointMeta>> {
        self.inner.meta(id)
    }
    fn remove(&mut self, id: &CheckpointId) -> Result<bool> {
        self.inner.remove(id)
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

fn gate(capacity: u64) -> (Box<dyn CheckpointStore>, Arc<AtomicBool>) {
    let stuck = Arc::new(AtomicBool::new(false));
    let store = Gate {
        inner: HostStore::new(capacity),
        stuck: Arc::clone(&stuck),
    };
    (Box::new(store), stuck)
}

fn find(link: &mut StoreLink, request: u64, prompt: &[u32]) -> Option<Found> {
    let keys = BlockKey::chain_all(prompt, super::TOKENS_PER_PAGE as usize, b"salt");
    let query = PrefixQuery {
        block_keys: &keys,
        tokens: prompt,
    };
    link.find(RequestId(request), Lookup::BlockPrefix, &query)
}

/// Calls `find` until it answers, for at most 10 s.
fn answer(link: &mut StoreLink, request: u64, prompt: &[u32]) -> Found {
    let start = Instant::now();
    loop {
        if let Some(found) = find(link, request, prompt) {
            return found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the lookup never answered"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn found_id(found: &Found) -> Option<(&str, u32)> {
    found
        .as_ref()
        .map(|(meta, blocks)| (meta.id.as_str(), *blocks))
}

#[test]
fn an_inline_link_answers_every_call_at_once() {
    let (store, _stuck) = gate(1 << 20);
    let mut link = StoreLink::inline(store);
    assert!(!link.is_threaded());
    link.put(RequestId(1), checkpoint("a", 1, &tokens(12)))
        .unwrap();
    let found = find(&mut link, 2, &tokens(16)).expect("inline answers at once");
    assert_eq!(found_id(&found), Some(("a", 3)));
    assert_eq!(link.n_lookups_outstanding(), 0);
    let a = CheckpointId::new("a").unwrap();
    assert!(link.ready(RequestId(2), &a), "inline reads at take");
    assert_eq!(link.take(RequestId(2), &a).unwrap().meta.n_tokens, 12);
}

#[test]
fn a_threaded_lookup_of_a_stuck_store_never_waits_and_answers_later_after_the_puts_before_it() {
    let (store, stuck) = gate(1 << 20);
    let mut link = StoreLink::threaded(store).unwrap();
    assert!(link.is_threaded());
    link.put(RequestId(1), checkpoint("a", 1, &tokens(12)))
        .unwrap();
    stuck.store(true, Ordering::Release);
    let asked = Instant::now();
    assert!(
        find(&mut link, 2, &tokens(16)).is_none(),
        "sent, not answered"
    );
    // The store is stuck: the lookup stays pending, and asking again neither blocks nor sends another.
    for _ in 0..20 {
        assert!(find(&mut link, 2, &tokens(16)).is_none());
    }
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "the caller waited for the store"
    );
    assert_eq!(link.n_lookups_outstanding(), 1);
    stuck.store(false, Ordering::Release);
    let found = answer(&mut link, 2, &tokens(16));
    assert_eq!(
        found_id(&found),
        Some(("a", 3)),
        "the put sent before the lookup is seen"
    );
    assert_eq!(link.n_lookups_outstanding(), 0);
    assert_eq!(link.stats().n_checkpoints, 1);
}

#[test]
fn a_threaded_link_drops_the_lookups_of_requests_no_longer_waiting() {
    let (store, stuck) = gate(1 << 20);
    let mut link = StoreLink::threaded(store).unwrap();
    stuck.store(true, Ordering::Release);
    assert!(find(&mut link, 1, &tokens(8)).is_none());
    assert!(find(&mut link, 2, &tokens(8)).is_none());
    link.retain(|request| request == RequestId(2));
    assert_eq!(link.n_lookups_outstanding(), 1);
    stuck.store(false, Ordering::Release);
    assert_eq!(found_id(&answer(&mut link, 2, &tokens(8))), None);
    assert_eq!(
        link.n_lookups_outstanding(),
        0,
        "request 1's late answer is dropped"
    );
}

#[test]
fn a_threaded_put_the_store_refuses_comes_back_with_its_request() {
    let (store, _stuck) = gate(64);
    let mut link = StoreLink::threaded(store).unwrap();
    let outcome = link
        .put(RequestId(7), checkpoint("big", 1, &tokens(12)))
        .unwrap();
    assert_eq!(outcome, PutOutcome::default(), "queued");
    // A lookup after it answers once the put was tried: then its failure is back.
    let _found = answer(&mut link, 8, &tokens(12));
    let failures = link.take_put_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, RequestId(7));
    assert!(
        matches!(failures[0].1, Error::TooLarge { .. }),
        "{:?}",
        failures[0].1
    );
    assert!(link.take_put_failures().is_empty());
}

#[test]
fn a_store_that_panics_is_dropped_and_every_later_call_fails_without_hanging() {
    let (store, _stuck) = gate(1 << 20);
    let mut link = StoreLink::threaded(store).unwrap();
    link.put(RequestId(1), checkpoint("a", 1, &tokens(12)))
        .unwrap();
    link.put(RequestId(2), checkpoint("panic", 1, &tokens(12)))
        .unwrap();
    assert_eq!(
        found_id(&answer(&mut link, 3, &tokens(16))),
        None,
        "a dropped store finds nothing"
    );
    let error = link
        .take(RequestId(3), &CheckpointId::new("a").unwrap())
        .unwrap_err();
    assert!(matches!(error, Error::StoreUnavailable { .. }), "{error:?}");
    link.put(RequestId(4), checkpoint("b", 1, &tokens(12)))
        .unwrap();
    let _found = answer(&mut link, 5, &tokens(16));
    let failures = link.take_put_failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, RequestId(4));
    drop(link); // joins the thread: a hang here fails the test by its timeout
}

#[test]
fn a_threaded_read_ahead_is_sent_once_and_taken_when_it_is_back() {
    let (store, _stuck) = gate(1 << 20);
    let mut link = StoreLink::threaded(store).unwrap();
    link.put(RequestId(1), checkpoint("a", 1, &tokens(12)))
        .unwrap();
    link.put(RequestId(1), checkpoint("b", 1, &tokens(8)))
        .unwrap();
    let (a, b) = (
        CheckpointId::new("a").unwrap(),
        CheckpointId::new("b").unwrap(),
    );
    assert!(!link.ready(RequestId(2), &a), "sent, not back");
    let start = Instant::now();
    while !link.ready(RequestId(2), &a) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the read never came back"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(link.take(RequestId(2), &a).unwrap().meta.id, a);
    // Asking for another checkpoint replaces the read; a take without a read waits for one.
    assert!(!link.ready(RequestId(3), &a));
    assert!(
        !link.ready(RequestId(3), &b),
        "another checkpoint: a new read"
    );
    assert_eq!(link.take(RequestId(3), &b).unwrap().meta.id, b);
    assert_eq!(link.take(RequestId(4), &a).unwrap().meta.id, a);
    link.retain(|_| false);
    assert!(matches!(
        link.take(RequestId(5), &CheckpointId::new("gone").unwrap()),
        Err(Error::NotFound { .. })
    ));
}
