//! Checkpoints in a disk store survive an engine restart: a new engine over the same directory restores the
//! previous engine's checkpoint, byte for byte equal to recompute (E3 verification is on in debug builds).

use checkpoint_transfer::DiskStore;
use engine::{Engine, EngineParams, Policy};
use kv_pool::RequestId;

use crate::agents::tokens;
use crate::contract::{TPP, metrics_of, params, seed_checkpoint, spec};

fn disk_params(policy: Policy) -> EngineParams {
    EngineParams {
        verify_restores: true,
        ..params(policy, 129)
    }
}

/// An engine of `params` over a disk store in `dir`, opened as the facade's `[store] dir` opens it.
fn disk_engine(params: EngineParams, dir: &std::path::Path) -> engine::Result<Engine> {
    let store = DiskStore::open(dir, params.store_capacity_bytes())?;
    Engine::builder(params).store(Box::new(store)).build()
}

#[test]
fn e3_disk_store_checkpoints_survive_an_engine_restart_and_restore_what_recompute_writes() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = tokens(5, 0, 0, 8 * TPP + 3);
    let output = {
        let mut before = disk_engine(disk_params(Policy::Reserved), dir.path()).unwrap();
        seed_checkpoint(&mut before, 1, &prompt, 4)
    };
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() > 0,
        "the store wrote files"
    );

    let mut after = disk_engine(disk_params(Policy::Reserved), dir.path()).unwrap();
    assert!(
        after.store_stats().n_checkpoints > 0,
        "reopening rebuilt the store's index"
    );
    let next_turn = [prompt.clone(), output, tokens(5, 0, 1, 20)].concat();
    after.submit(spec(2, next_turn, 2, after.now())).unwrap();
    let _steps = after.run_until_idle(100_000).expect("run");
    let turn = metrics_of(&after, 2);
    assert!(
        turn.restored,
        "the second turn restored from the reopened store"
    );
    assert_eq!(
        turn.prompt_tokens_restored,
        8 * TPP,
        "every full block of the first prompt came back"
    );
    assert!(
        after.pages_verified() >= 8,
        "restored pages were checked against recompute"
    );
    assert_eq!(after.request(RequestId(2)), None);
    assert_eq!(after.leaked_pages(), 0);
}

#[test]
fn a_store_directory_that_cannot_be_opened_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let error = disk_engine(disk_params(Policy::Reserved), &file).unwrap_err();
    assert!(error.to_string().contains("not-a-directory"), "{error}");
}

#[test]
fn a_second_engine_on_a_store_directory_in_use_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = disk_engine(disk_params(Policy::Reserved), dir.path()).unwrap();
    let error = disk_engine(disk_params(Policy::Ordinary), dir.path()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("is in use by pid {} on ", std::process::id())),
        "{error}"
    );
    drop(first);
    disk_engine(disk_params(Policy::Ordinary), dir.path()).unwrap();
}

#[test]
fn captures_the_store_cannot_write_are_counted_and_the_engine_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut engine = disk_engine(disk_params(Policy::Reserved), &store_dir).unwrap();
    // The store directory replaced by a file: every write fails, for root too.
    std::fs::remove_dir_all(&store_dir).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    let prompt = tokens(5, 0, 0, 8 * TPP + 3);
    let output = seed_checkpoint(&mut engine, 1, &prompt, 4);
    assert_eq!(
        output.len(),
        4,
        "the request finished without its checkpoint"
    );
    let run = engine.metrics();
    assert!(run.store_write_failures >= 1, "{run:?}");
    assert_eq!(
        run.store_write_failures,
        engine.store_stats().n_write_failures
    );
    assert_eq!(engine.store_stats().n_checkpoints, 0);
    assert_eq!(engine.leaked_pages(), 0);
}

/// Runs `body` with this thread's logs captured (every level, no colour); returns what they printed.
pub(crate) fn captured_logs(body: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .expect("not poisoned")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    tracing::subscriber::with_default(subscriber, body);
    let bytes = buffer.0.lock().expect("not poisoned").clone();
    String::from_utf8(bytes).expect("logs are text")
}

#[test]
fn failed_store_writes_are_warned_with_their_cause_and_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut engine = disk_engine(disk_params(Policy::Reserved), &store_dir).unwrap();
    std::fs::remove_dir_all(&store_dir).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    let logs = captured_logs(|| {
        // 130 requests, two captures each: 260 failed writes.
        for id in 0..130 {
            let prompt = tokens(6, id, 0, 2 * TPP);
            engine
                .submit(spec(u64::from(id), prompt, 2, engine.now()))
                .unwrap();
            let _steps = engine.run_until_idle(10_000).unwrap();
        }
    });
    let failures = engine.store_stats().n_write_failures;
    assert!(failures >= 250, "{failures} failures");
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("the store cannot write"))
        .collect();
    // The first failure, then every 100th: 1, 100, 200.
    assert_eq!(warnings.len(), 3, "{logs}");
    assert!(
        warnings[0].contains("Not a directory") || warnings[0].contains("not a directory"),
        "the cause is named: {}",
        warnings[0]
    );
}

#[test]
fn a_store_reopened_with_a_lower_capacity_warns_what_it_evicted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut engine = disk_engine(disk_params(Policy::Reserved), dir.path()).unwrap();
        for id in 0..6 {
            seed_checkpoint(&mut engine, id, &tokens(7, id as u32, 0, 4 * TPP), 1);
        }
        assert!(engine.store_stats().n_checkpoints >= 6);
    }
    let logs = captured_logs(|| {
        let smaller = EngineParams {
            store_capacity_pages: 5,
            ..disk_params(Policy::Reserved)
        };
        let engine = disk_engine(smaller, dir.path()).unwrap();
        assert!(engine.store_stats().n_checkpoints <= 1);
    });
    assert!(
        logs.lines().any(|line| line.contains("WARN")
            && line.contains("evicted whole checkpoints")
            && line.contains("n_evicted=")),
        "{logs}"
    );
}

/// An engine that does not verify still writes the pages' content when its store outlives it: a later
/// engine that verifies restores them byte for byte. When its store dies with it too, nothing can check the
/// bytes and none is written (the same output either way); verifying, they are written.
#[test]
fn e3_an_engine_that_does_not_verify_writes_page_content_only_for_a_store_that_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = tokens(6, 0, 0, 8 * TPP + 3);
    let unverified = EngineParams {
        verify_restores: false,
        ..disk_params(Policy::Reserved)
    };
    let output = {
        let mut before = disk_engine(unverified.clone(), dir.path()).unwrap();
        seed_checkpoint(&mut before, 1, &prompt, 4)
    };
    let mut after = disk_engine(disk_params(Policy::Reserved), dir.path()).unwrap();
    let next_turn = [prompt.clone(), output.clone(), tokens(6, 0, 1, 20)].concat();
    after.submit(spec(2, next_turn, 2, after.now())).unwrap();
    let _steps = after.run_until_idle(100_000).expect("run");
    assert!(metrics_of(&after, 2).restored);
    assert!(after.pages_verified() >= 8, "restored pages were checked");
    // In memory: written only when verifying.
    for verify_restores in [false, true] {
        let params = EngineParams {
            verify_restores,
            ..unverified.clone()
        };
        let page_bytes = params.page_bytes as usize;
        let storage = std::sync::Arc::new(
            kv_pool::HostStorage::new(1, params.pool_pages(), page_bytes).unwrap(),
        );
        let mut engine = Engine::builder(params.clone())
            .storage(storage.clone())
            .build()
            .unwrap();
        assert_eq!(seed_checkpoint(&mut engine, 1, &prompt, 4), output);
        let mut bytes = vec![0u8; page_bytes];
        let mut written = 0;
        for page in 1..params.pool_pages() {
            kv_pool::PageStorage::read(&*storage, 0, kv_pool::PageId(page), &mut bytes).unwrap();
            written += usize::from(bytes.iter().any(|&byte| byte != 0));
        }
        assert_eq!(written > 0, verify_restores, "{written} pages written");
    }
}
