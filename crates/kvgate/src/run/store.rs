//! What a run's checkpoint store held before the run: a persistent store (`[store] dir` or `url`) keeps
//! the checkpoints of earlier runs, which then serve this run's prompts, so a report names the store and
//! whether it started warm.

use engine::Policy;
use serde::Serialize;

use crate::config::EngineConfig;
use crate::error::Result;

/// One engine's checkpoint store as the run found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoreAtStart {
    /// `host`, `disk` or `redis`.
    pub kind: &'static str,
    /// Where it lives: empty for host memory, the directory of a disk store, the URL and key prefix of a
    /// Redis store.
    pub location: String,
    /// Checkpoints it held before the run (0 for host memory, which starts empty).
    pub checkpoints: usize,
}

impl StoreAtStart {
    /// Whether the store held checkpoints of earlier runs.
    pub fn warm(&self) -> bool {
        self.checkpoints > 0
    }
}

/// The store the engine of `config` under `policy` opens, and the checkpoints it holds now: a disk or
/// Redis store is opened (and closed again) to count them. Errors: whatever opening the store gives (a
/// directory another engine holds, a server that does not answer).
pub fn store_at_start(config: &EngineConfig, policy: Policy) -> Result<StoreAtStart> {
    let (kind, location) = match (&config.store.dir, &config.store.url) {
        (Some(dir), _) => ("disk", dir.display().to_string()),
        (None, Some(url)) => ("redis", format!("{url} keys {}*", config.store.key_prefix)),
        (None, None) => ("host", String::new()),
    };
    let checkpoints = if kind == "host" {
        0
    } else {
        let store = crate::builder::open_store(config, &config.engine_params(policy)?)?;
        store.stats().n_checkpoints
    };
    Ok(StoreAtStart {
        kind,
        location,
        checkpoints,
    })
}

/// How a report's header names the stores of `stores` (policy, store), one per engine: the kind, and for a
/// persistent store where it is and what each engine found in it.
pub fn describe_stores(stores: &[(String, StoreAtStart)]) -> String {
    let Some((_, first)) = stores.first() else {
        return String::new();
    };
    if first.kind == "host" {
        return "checkpoint store: host memory, empty at the start".to_string();
    }
    let found: Vec<String> = stores
        .iter()
        .map(|(policy, store)| format!("{policy} {}", store.checkpoints))
        .collect();
    // One engine's store, or the pattern of several: `<policy>` where each has its own name.
    let location = match stores {
        [(_, only)] => only.location.clone(),
        [(policy, first), ..] => first.location.replace(policy.as_str(), "<policy>"),
        [] => String::new(),
    };
    let warm = if stores.iter().any(|(_, s)| s.warm()) {
        "started warm"
    } else {
        "started empty"
    };
    format!(
        "checkpoint store: {} ({location}), {warm}: checkpoints at the start {}",
        first.kind,
        found.join(", ")
    )
}
