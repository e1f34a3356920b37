//! Checkpoints in a disk store survive an engine restart: a new engine over the same directory restores the
//! previous engine's checkpoint, byte for byte equal to recompute (E3 verification is on in debug builds).

use engine::{Engine, EngineParams, Policy};
use kv_pool::RequestId;

use crate::agents::tokens;
use crate::contract::{TPP, metrics_of, params, seed_checkpoint, spec};

fn disk_params(policy: Policy, dir: &std::path::Path) -> EngineParams {
    EngineParams {
        store_dir: Some(dir.to_path_buf()),
        verify_restores: true,
        ..params(policy, 129)
    }
}

#[test]
fn e3_disk_store_checkpoints_survive_an_engine_restart_and_restore_what_recompute_writes() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = tokens(5, 0, 0, 8 * TPP + 3);
    let output = {
        let mut before = Engine::new(disk_params(Policy::Reserved, dir.path())).unwrap();
        seed_checkpoint(&mut before, 1, &prompt, 4)
    };
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() > 0,
        "the store wrote files"
    );

    let mut after = Engine::new(disk_params(Policy::Reserved, dir.path())).unwrap();
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
    let error = Engine::new(disk_params(Policy::Reserved, &file)).unwrap_err();
    assert!(error.to_string().contains("not-a-directory"), "{error}");
}

#[test]
fn a_second_engine_on_a_store_directory_in_use_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = Engine::new(disk_params(Policy::Reserved, dir.path())).unwrap();
    let error = Engine::new(disk_params(Policy::Ordinary, dir.path())).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("is in use by pid {} on ", std::process::id())),
        "{error}"
    );
    drop(first);
    Engine::new(disk_params(Policy::Ordinary, dir.path())).unwrap();
}

#[test]
fn captures_the_store_cannot_write_are_counted_and_the_engine_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut engine = Engine::new(disk_params(Policy::Reserved, &store_dir)).unwrap();
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
