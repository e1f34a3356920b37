//! Property tests over random sequences of reserve / publish / admit / allocate / window free / finish /
//! cancel / drain / competitor allocate and free / clock advance on a small pool.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use std::time::Duration;

use kv_pool::{CacheGroup, Geometry, GroupKind, PageId, PagePool};
use proptest::prelude::*;

use crate::{Ledger, LedgerConfig, Preflight, RestoreSpec, TicketState};
use kv_pool::{AdmissionOrder, RequestId, Timestamp};

const N_REQUESTS: u64 = 4;

#[derive(Clone, Debug)]
enum Op {
    Reserve { id: u64, boundary: u32, extra: u32 },
    Publish { id: u64 },
    HandOver { id: u64 },
    Admit { id: u64 },
    Allocate { id: u64, n_pages: u32 },
    WindowFree { id: u64, n_pages: u32 },
    Finish { id: u64 },
    Release { id: u64 },
    Drain,
    Compete { n_pages: u32 },
    CompetitorFree { n_pages: u32 },
    Advance { secs: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..N_REQUESTS;
    prop_oneof![
        3 => (id.clone(), 1u32..24, 0u32..24).prop_map(|(id, boundary, extra)| Op::Reserve { id, boundary, extra }),
        2 => id.clone().prop_map(|id| Op::Publish { id }),
        1 => id.clone().prop_map(|id| Op::HandOver { id }),
        2 => id.clone().prop_map(|id| Op::Admit { id }),
        2 => (id.clone(), 0u32..4).prop_map(|(id, n_pages)| Op::Allocate { id, n_pages }),
        1 => (id.clone(), 0u32..3).prop_map(|(id, n_pages)| Op::WindowFree { id, n_pages }),
        1 => id.clone().prop_map(|id| Op::Finish { id }),
        1 => id.prop_map(|id| Op::Release { id }),
        1 => Just(Op::Drain),
        1 => (0u32..4).prop_map(|n_pages| Op::Compete { n_pages }),
        1 => (0u32..4).prop_map(|n_pages| Op::CompetitorFree { n_pages }),
        1 => (0u64..40).prop_map(|secs| Op::Advance { secs }),
    ]
}

/// The engine side: pages each consumer holds, imports it acquired, handed-over pages, competitor pages.
#[derive(Default)]
struct World {
    consumer_pages: Vec<Vec<PageId>>,
    acquired: Vec<Vec<PageId>>,
    ticket_pages: Vec<Vec<PageId>>,
    /// Pages each consumer allocated from its current ticket's credits (a request that restores again keeps
    /// the pages of its earlier ticket, but those are no longer the new ticket's).
    ticket_held: Vec<u32>,
    /// Pages an importing ticket handed over, per request (an index pins them from then on).
    handed: Vec<Vec<PageId>>,
    /// Whether each request's current ticket handed its pages over.
    handed_over: Vec<bool>,
    /// Handed-over pages of released tickets, waiting for their copies to drain.
    handed_draining: Vec<PageId>,
    competitor: Vec<PageId>,
}

fn free_request(world: &mut World, pool: &mut PagePool, idx: usize) {
    let pages: Vec<PageId> = world.consumer_pages[idx]
        .drain(..)
        .chain(world.acquired[idx].drain(..))
        .collect();
    pool.free_all(&pages).expect("request pages held");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(192)
    ))]

    /// After every operation: the ledger's and the pool's invariants hold; outstanding credits never exceed
    /// the free pages (nobody allocates past them here); ticket slots never exceed the limit; a released
    /// request holds no ticket, waiter or credit, and releasing it again changes nothing; at the end, once
    /// everything is released, drained and freed, every usable page is free again (no leak).
    #[test]
    fn prop_ledger_invariants_hold_over_random_operations(ops in proptest::collection::vec(op(), 1..80)) {
        let group = CacheGroup { kind: GroupKind::Full, bytes_per_page: 64 };
        let geometry = Geometry::new(vec![group], 4, 1, 4096).expect("geometry");
        let config = LedgerConfig { max_running_slots: 3, restore_max_wait: Duration::from_secs(60) };
        let mut ledger = Ledger::new(geometry.clone(), config);
        let n_usable = 24;
        let mut pool = PagePool::new(1 + n_usable).expect("pool");
        let mut world = World {
            consumer_pages: vec![Vec::new(); N_REQUESTS as usize],
            acquired: vec![Vec::new(); N_REQUESTS as usize],
            ticket_pages: vec![Vec::new(); N_REQUESTS as usize],
            ticket_held: vec![0; N_REQUESTS as usize],
            handed: vec![Vec::new(); N_REQUESTS as usize],
            handed_over: vec![false; N_REQUESTS as usize],
            ..World::default()
        };
        let mut now = Timestamp::ZERO;
        for op in ops {
            match op {
                Op::Reserve { id, boundary, extra } => {
                    let spec = RestoreSpec::for_geometry(&geometry, boundary, boundary + extra, 8);
                    let preflight = Preflight { running_requests: 0, ..Preflight::default() };
                    let free = pool.n_free();
                    let credits = ledger.credit_pages();
                    match ledger.reserve(&mut pool, RequestId(id), AdmissionOrder::fcfs(id), &spec, &preflight, now) {
                        Ok(ticket) => {
                            world.ticket_pages[id as usize] = ticket.import_pages;
                            world.handed_over[id as usize] = false;
                            world.ticket_held[id as usize] = 0;
                        }
                        Err(_) => {
                            prop_assert_eq!(pool.n_free(), free);
                            prop_assert_eq!(ledger.credit_pages(), credits);
                        }
                    }
                }
                Op::Publish { id } => { let _ = ledger.publish(RequestId(id)); }
                Op::HandOver { id } => {
                    let idx = id as usize;
                    if ledger.ticket_state(RequestId(id)) == Some(TicketState::Importing) {
                        let pages = ledger.hand_over_pages(RequestId(id)).expect("importing");
                        prop_assert_eq!(&pages, &world.ticket_pages[idx]);
                        world.ticket_pages[idx].clear();
                        world.handed_over[idx] = true;
                        world.handed[idx].extend(pages);
                        // A second hand-over gives nothing more.
                        prop_assert!(ledger.hand_over_pages(RequestId(id)).expect("importing").is_empty());
                    } else {
                        let refused = ledger.hand_over_pages(RequestId(id));
                        prop_assert!(refused.is_err(), "{:?}", refused);
                    }
                }
                Op::Admit { id } => {
                    if ledger.ticket_state(RequestId(id)) == Some(TicketState::Ready) {
                        let pages = std::mem::take(&mut world.ticket_pages[id as usize]);
                        for &page in &pages {
                            pool.touch(page).expect("acquire");
                        }
                        // Handed-over pages: the consumer takes the holder's references over.
                        let handed = std::mem::take(&mut world.handed[id as usize]);
                        world.acquired[id as usize].extend(handed);
                        ledger.admit(RequestId(id), &mut pool).expect("ready");
                        // A request may finish its prompt and restore again while it still holds the pages
                        // of its first import: it keeps both.
                        world.acquired[id as usize].extend(pages);
                    }
                }
                Op::Allocate { id, n_pages } => {
                    if let Ok(pages) = ledger.allocate(&mut pool, RequestId(id), n_pages) {
                        world.ticket_held[id as usize] += n_pages;
                        world.consumer_pages[id as usize].extend(pages);
                    }
                }
                Op::WindowFree { id, n_pages } => {
                    if ledger.ticket_state(RequestId(id)) == Some(TicketState::Admitted) {
                        let idx = id as usize;
                        let held = world.ticket_held[idx];
                        if n_pages > held {
                            // More than this ticket's pages: refused, nothing changes.
                            let credits = ledger.credit_pages();
                            let refused = ledger.release_window_pages(RequestId(id), n_pages);
                            let refused_as_expected = matches!(refused, Err(crate::Error::WindowFreeExceedsHeld { .. }));
                            prop_assert!(refused_as_expected, "{:?}", refused);
                            prop_assert_eq!(ledger.credit_pages(), credits);
                        } else if n_pages > 0 {
                            let pages = &mut world.consumer_pages[idx];
                            let freed: Vec<PageId> = pages.split_off(pages.len() - n_pages as usize);
                            pool.free_all(&freed).expect("held");
                            ledger.release_window_pages(RequestId(id), n_pages).expect("admitted");
                            world.ticket_held[idx] -= n_pages;
                        }
                    }
                }
                Op::Finish { id } => {
                    if ledger.finish_prompt(RequestId(id)).is_ok() {
                        world.ticket_held[id as usize] = 0;
                    }
                }
                Op::Release { id } => {
                    // The pages the ticket still holds (never handed over, or a ready import's) come back at
                    // once: no copy writes into them. Handed-over pages stay with their holder.
                    let free = pool.n_free();
                    let released = ledger.release(RequestId(id), &mut pool);
                    let held = world.ticket_pages[id as usize].len() as u32;
                    prop_assert_eq!(released.freed_import_pages, held);
                    prop_assert_eq!(pool.n_free(), free + held);
                    world.ticket_pages[id as usize].clear();
                    world.ticket_held[id as usize] = 0;
                    let handed = std::mem::take(&mut world.handed[id as usize]);
                    world.handed_draining.extend(handed);
                    free_request(&mut world, &mut pool, id as usize);
                    prop_assert!(!ledger.holds_anything(RequestId(id)));
                    prop_assert_eq!(ledger.credit_pages_of(RequestId(id)), 0);
                    let free = pool.n_free();
                    prop_assert!(ledger.release(RequestId(id), &mut pool).is_noop());
                    prop_assert_eq!(pool.n_free(), free);
                }
                Op::Drain => {
                    let handed = std::mem::take(&mut world.handed_draining);
                    pool.free_all(&handed).expect("held by the holder");
                }
                Op::Compete { n_pages } => {
                    if n_pages <= ledger.available_pages(&pool, &Preflight::default()) {
                        world.competitor.extend(pool.allocate(n_pages).expect("available"));
                    }
                }
                Op::CompetitorFree { n_pages } => {
                    let n = (n_pages as usize).min(world.competitor.len());
                    let freed: Vec<PageId> = world.competitor.drain(..n).collect();
                    pool.free_all(&freed).expect("held");
                }
                Op::Advance { secs } => now = now.after(Duration::from_secs(secs)),
            }
            ledger.check_invariants(&pool).unwrap();
            pool.check_invariants().unwrap();
            prop_assert!(ledger.credit_pages() <= pool.n_free(), "credits {} > free {}", ledger.credit_pages(), pool.n_free());
            prop_assert!(ledger.slots_held() <= 3);
        }
        for id in 0..N_REQUESTS {
            let _released = ledger.release(RequestId(id), &mut pool);
            free_request(&mut world, &mut pool, id as usize);
        }
        let handed: Vec<PageId> = world.handed.concat().into_iter().chain(world.handed_draining.drain(..)).collect();
        pool.free_all(&handed).expect("held by the holder");
        pool.free_all(&world.competitor).expect("held");
        prop_assert_eq!(ledger.snapshot().credit_pages, 0);
        prop_assert_eq!(ledger.n_tickets() + ledger.n_waiters(), 0);
        prop_assert_eq!(pool.n_free(), n_usable);
    }
}
