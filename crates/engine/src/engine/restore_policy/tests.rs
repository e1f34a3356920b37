//! The ticket handle: a policy with a ledger makes one when it reserves, every step on the ticket takes it, and
//! ending the ticket consumes it.

use std::time::Duration;

use kv_pool::{AdmissionOrder, CacheGroup, Geometry, GroupKind, PagePool, RequestId, Timestamp};
use reservation::{Ledger, LedgerConfig, Preflight, RestoreSpec, TicketState};

use super::{Ordinary, Reservation, ReserveAsk, Reserved, RestorePolicy, TicketHandle};
use crate::error::{Error, Result};

const REQUEST: RequestId = RequestId(7);

/// Full attention, 4 tokens a page; a pool of 8 usable pages and 2 running slots.
fn reserved() -> (Reserved, PagePool) {
    let group = CacheGroup {
        kind: GroupKind::Full,
        bytes_per_page: 64,
    };
    let geometry = Geometry::new(vec![group], 4, 1, 4096).expect("valid geometry");
    let ledger = Ledger::new(geometry, LedgerConfig::new(2));
    (Reserved::new(ledger), PagePool::new(1 + 8).expect("pool"))
}

/// Reserves a restore of 8 tokens (2 import pages) of a 16-token prompt for `REQUEST`.
fn reserve(policy: &mut Reserved, pool: &mut PagePool) -> (TicketHandle, Vec<kv_pool::PageId>) {
    let geometry = policy.ledger().expect("a ledger").geometry().clone();
    let preflight = Preflight::default();
    let ask = ReserveAsk {
        request: REQUEST,
        order: AdmissionOrder::fcfs(REQUEST.0),
        spec: RestoreSpec::for_geometry(&geometry, 8, 16, 16),
        preflight: &preflight,
        import_pages: 2,
        admissible_pages: pool.n_free(),
        now: Timestamp::ZERO,
        max_wait: Duration::from_secs(10),
    };
    match policy.reserve(pool, &ask) {
        Ok(Reservation::Ticket { ticket, pages }) => (ticket, pages),
        other => panic!("expected a ticket, got {other:?}"),
    }
}

fn state(policy: &Reserved) -> Option<TicketState> {
    policy
        .ledger()
        .and_then(|ledger| ledger.ticket_state(REQUEST))
}

/// The handle is the request's; releasing it ends the ticket and gives every page back (none was handed to a
/// copy).
#[test]
fn releasing_a_ticket_consumes_its_handle_and_gives_back_its_slot_credits_and_pages() -> Result<()>
{
    let (mut policy, mut pool) = reserved();
    let free = pool.n_free();
    let (ticket, pages) = reserve(&mut policy, &mut pool);
    assert_eq!(ticket.request(), REQUEST);
    assert_eq!(
        (pages.len(), state(&policy)),
        (2, Some(TicketState::Importing))
    );
    assert!(policy.slots_held() == 1 && policy.credit_pages() > 0);
    policy.release(ticket, &mut pool)?;
    assert_eq!(state(&policy), None);
    assert_eq!((policy.slots_held(), policy.credit_pages()), (0, 0));
    assert_eq!(pool.n_free(), free);
    Ok(())
}

/// C6 through the handle: staged, published, admitted, then the prompt's end consumes it.
#[test]
fn a_ticket_ends_once_its_prompt_is_computed_and_its_handle_is_gone() -> Result<()> {
    let (mut policy, mut pool) = reserved();
    let (ticket, pages) = reserve(&mut policy, &mut pool);
    let handed = policy.hand_over(&ticket)?;
    assert_eq!(handed, pages);
    // The handed references stand for the index's, which the consumer's `acquire` would take over.
    policy.publish(REQUEST)?;
    policy.admit(&ticket, &mut pool)?;
    assert_eq!(state(&policy), Some(TicketState::Admitted));
    policy.finish_prompt(ticket)?;
    assert_eq!(state(&policy), None);
    Ok(())
}

/// A handle whose ticket the ledger no longer has (made by hand: the engine cannot) is an internal error, not a
/// silent second release; ending a ticket before it is admitted is one too.
#[test]
fn a_handle_without_its_ticket_and_an_early_prompt_end_are_internal_errors() -> Result<()> {
    let (mut policy, mut pool) = reserved();
    assert!(matches!(
        policy.release(TicketHandle::new(REQUEST), &mut pool),
        Err(Error::Internal { .. })
    ));
    let (ticket, _pages) = reserve(&mut policy, &mut pool);
    assert!(matches!(
        policy.finish_prompt(TicketHandle::new(REQUEST)),
        Err(Error::Internal { .. })
    ));
    assert_eq!(state(&policy), Some(TicketState::Importing));
    policy.release(ticket, &mut pool)
}

/// A policy without a ledger makes no handle, and refuses one it is handed.
#[test]
fn a_policy_without_tickets_refuses_every_ticket_step() {
    let mut pool = PagePool::new(1 + 8).expect("pool");
    let mut policy = Ordinary;
    assert!(matches!(
        policy.hand_over(&TicketHandle::new(REQUEST)),
        Err(Error::Internal { .. })
    ));
    assert!(matches!(
        policy.admit(&TicketHandle::new(REQUEST), &mut pool),
        Err(Error::Internal { .. })
    ));
    assert!(matches!(
        policy.finish_prompt(TicketHandle::new(REQUEST)),
        Err(Error::Internal { .. })
    ));
    assert!(matches!(
        policy.release(TicketHandle::new(REQUEST), &mut pool),
        Err(Error::Internal { .. })
    ));
}
