//! The page-availability rules, each named once and called from every site that applies it: the ledger's
//! preflight, admission's gates (with or without a ledger), the coordinator's `pages-only` reservation and the
//! engine's running pass. Counts are pages of one rank's pool.

use crate::config::Preflight;

/// R2: pages a new admission or reservation may take now: the free pages minus every outstanding credit
/// (C1), minus the remaining needs of in-flight prefills that hold no ticket, minus the watermark while other
/// work is scheduled. Capacity waiters' holds are not part of it: they hold back only later restores (Q2).
pub fn pages_available_to_admit(n_free: u32, credit_pages: u32, preflight: &Preflight) -> u32 {
    pages_unprotected(n_free, credit_pages)
        .saturating_sub(preflight.unticketed_prefill_pages)
        .saturating_sub(preflight.applied_watermark_pages())
}

/// C1: pages a running request without a ticket may take: the free pages no credit protects.
pub fn pages_unprotected(n_free: u32, credit_pages: u32) -> u32 {
    n_free.saturating_sub(credit_pages)
}

/// C5: pages a running decode may take: every free page, credit-protected ones included (credits never make
/// a decode wait or be preempted).
pub fn pages_for_decode(n_free: u32) -> u32 {
    n_free
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_subtracts_what_it_names_and_never_underflows() {
        let busy = Preflight {
            running_requests: 1,
            unticketed_prefill_pages: 3,
            watermark_pages: 2,
            other_work_scheduled: true,
        };
        assert_eq!(pages_available_to_admit(20, 5, &busy), 10);
        let idle = Preflight {
            other_work_scheduled: false,
            ..busy
        };
        assert_eq!(
            pages_available_to_admit(20, 5, &idle),
            12,
            "no watermark when idle"
        );
        assert_eq!(pages_available_to_admit(4, 5, &busy), 0);
        assert_eq!(pages_unprotected(20, 5), 15);
        assert_eq!(
            pages_unprotected(3, 5),
            0,
            "decodes may have dipped below the credits"
        );
        assert_eq!(pages_for_decode(3), 3);
    }
}
