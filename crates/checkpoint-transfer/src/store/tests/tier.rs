//! The put/get/remove skeleton every store tier shares (`Tier`), on a fake tier whose medium is a map and whose
//! writes, reads, admission and lookups can be made to fail: what the skeleton does with each failure,
//! whatever the medium.

use foldhash::HashMap;

use super::{TEN_TOKEN_BYTES, checkpoint, find, tokens};
use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload};
use crate::error::{Error, Result};
use crate::store::catalog::Catalog;
use crate::store::tier::Tier;
use crate::store::{CheckpointStore, PutOutcome};

/// A tier on a map, recording what the skeleton asked of it.
#[derive(Debug)]
struct FakeTier {
    catalog: Catalog,
    medium: HashMap<CheckpointId, CheckpointPayload>,
    refuse_puts: bool,
    fail_writes: bool,
    fail_reads: bool,
    lookups_fail: bool,
    deleted: Vec<CheckpointId>,
    read_failures: Vec<CheckpointId>,
}

impl FakeTier {
    fn new(capacity_bytes: u64) -> FakeTier {
        FakeTier {
            catalog: Catalog::new(capacity_bytes),
            medium: HashMap::default(),
            refuse_puts: false,
            fail_writes: false,
            fail_reads: false,
            lookups_fail: false,
            deleted: Vec::new(),
            read_failures: Vec::new(),
        }
    }
}

fn failure(reason: &str) -> Error {
    Error::Remote {
        url: "fake".to_string(),
        reason: reason.to_string(),
    }
}

impl Tier for FakeTier {
    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    fn sync_for_lookup(&mut self) -> bool {
        !self.lookups_fail
    }

    fn admit_put(&mut self) -> Result<()> {
        match self.refuse_puts {
            true => Err(failure("refused")),
            false => Ok(()),
        }
    }

    fn write(&mut self, checkpoint: Checkpoint, outcome: &PutOutcome) -> Result<CheckpointMeta> {
        for evicted in &outcome.evicted {
            self.medium.remove(evicted);
            self.deleted.push(evicted.clone());
        }
        if self.fail_writes {
            return Err(failure("write failed"));
        }
        self.medium
            .insert(checkpoint.meta.id.clone(), checkpoint.payload);
        Ok(checkpoint.meta)
    }

    fn read(&mut self, meta: &CheckpointMeta) -> Result<CheckpointPayload> {
        match (self.fail_reads, self.medium.get(&meta.id)) {
            (false, Some(payload)) => Ok(payload.clone()),
            _ => Err(failure("read failed")),
        }
    }

    fn read_failed(&mut self, id: &CheckpointId, _error: &Error) {
        self.read_failures.push(id.clone());
    }

    fn delete(&mut self, meta: &CheckpointMeta) -> Result<()> {
        self.medium.remove(&meta.id);
        self.deleted.push(meta.id.clone());
        Ok(())
    }
}

fn id(name: &str) -> CheckpointId {
    CheckpointId::new(name).unwrap()
}

/// A tier full with "old", set up by `fail`, then the put of "new" (as large as "old"), which must fail with
/// `reason`.
fn put_over_a_full_tier(fail: impl FnOnce(&mut FakeTier), reason: &str) -> FakeTier {
    let mut tier = FakeTier::new(TEN_TOKEN_BYTES);
    tier.put(checkpoint("old", 1, &tokens(10))).unwrap();
    fail(&mut tier);
    let error = tier.put(checkpoint("new", 1, &[9; 10])).unwrap_err();
    assert!(
        matches!(&error, Error::Remote { reason: found, .. } if found == reason),
        "{error}"
    );
    tier
}

#[test]
fn a_put_the_tier_cannot_write_catalogs_nothing_and_counts_one_write_failure() {
    let mut tier = put_over_a_full_tier(|tier| tier.fail_writes = true, "write failed");
    let stats = tier.stats();
    assert_eq!(stats.n_write_failures, 1);
    // The catalog made room (evicting "old") before the write failed; "new" is not catalogued either.
    assert_eq!(stats.n_checkpoints, 0);
    assert_eq!(stats.n_evictions, 1);
    assert_eq!(tier.deleted, vec![id("old")]);
    assert!(tier.meta(&id("new")).is_none());
    assert_eq!(find(&mut tier, &[9; 10]), None);
    tier.catalog.check_invariants();
}

#[test]
fn a_put_the_tier_refuses_to_admit_counts_a_write_failure_and_evicts_nothing() {
    let mut tier = put_over_a_full_tier(|tier| tier.refuse_puts = true, "refused");
    let stats = tier.stats();
    assert_eq!((stats.n_write_failures, stats.n_evictions), (1, 0));
    assert!(tier.meta(&id("old")).is_some());
    assert!(tier.deleted.is_empty());
    // A refusal by the catalog (a stale generation) is no write failure.
    tier.refuse_puts = false;
    let stale = tier.put(checkpoint("old", 1, &tokens(10))).unwrap_err();
    assert!(matches!(stale, Error::StaleGeneration { .. }), "{stale}");
    assert_eq!(tier.stats().n_write_failures, 1);
}

#[test]
fn a_checkpoint_the_tier_cannot_read_is_forgotten_and_reported_to_the_tier_once() {
    let mut tier = FakeTier::new(1 << 20);
    tier.put(checkpoint("a", 1, &tokens(10))).unwrap();
    assert_eq!(tier.get(&id("a")).unwrap(), checkpoint("a", 1, &tokens(10)));
    tier.fail_reads = true;
    let error = tier.get(&id("a")).unwrap_err();
    assert!(
        matches!(&error, Error::Remote { reason, .. } if reason == "read failed"),
        "{error}"
    );
    assert_eq!(tier.read_failures, vec![id("a")]);
    assert!(tier.meta(&id("a")).is_none());
    assert_eq!(find(&mut tier, &tokens(10)), None);
    // Forgotten: a second get finds nothing to read and asks the tier nothing.
    let again = tier.get(&id("a")).unwrap_err();
    assert!(matches!(again, Error::NotFound { .. }), "{again}");
    assert_eq!(tier.read_failures.len(), 1);
    tier.catalog.check_invariants();
}

#[test]
fn remove_deletes_through_the_tier_only_what_the_catalog_holds() {
    let mut tier = FakeTier::new(1 << 20);
    tier.put(checkpoint("a", 1, &tokens(10))).unwrap();
    assert!(!tier.remove(&id("b")).unwrap());
    assert!(tier.deleted.is_empty());
    assert!(tier.remove(&id("a")).unwrap());
    assert_eq!(tier.deleted, vec![id("a")]);
    assert!(tier.medium.is_empty());
    assert_eq!(tier.stats().n_checkpoints, 0);
}

#[test]
fn a_tier_that_cannot_sync_finds_nothing_until_it_can() {
    let mut tier = FakeTier::new(1 << 20);
    tier.put(checkpoint("a", 1, &tokens(10))).unwrap();
    tier.lookups_fail = true;
    assert_eq!(find(&mut tier, &tokens(10)), None);
    tier.lookups_fail = false;
    assert_eq!(find(&mut tier, &tokens(10)).as_deref(), Some("a"));
}
