//! The disk store around its crash-safe core: one owner per directory (the lock), a lowered capacity
//! evicting whole checkpoints, hostile files (links, FIFOs, directories, oversized manifests) reported and
//! skipped without blocking, every single-byte flip of a manifest rejected by its own checksum, and failed
//! writes returned with their cause and counted.
#![allow(
    clippy::print_stderr,
    reason = "a test that cannot run its case says so"
)]

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use super::{TEN_TOKEN_BYTES, checkpoint, tokens};
use crate::checkpoint::CheckpointId;
use crate::error::Error;
use crate::store::manifest::MANIFEST_BYTES_MAX;
use crate::store::{CheckpointStore, DiskStore};

fn id(name: &str) -> CheckpointId {
    CheckpointId::new(name).unwrap()
}

/// The names in `dir`, sorted.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Opens `dir` on another thread and fails the test if that takes more than ten seconds (a FIFO that blocks
/// the open, a device read without end).
fn open_within_ten_seconds(dir: &Path, capacity_bytes: u64) -> DiskStore {
    let (sender, receiver) = mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _closed = sender.send(DiskStore::open(dir, capacity_bytes));
    });
    receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("opening the store blocked")
        .unwrap()
}

#[test]
fn a_second_store_on_a_locked_directory_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = DiskStore::open(dir.path(), 1 << 20).unwrap();
    let err = DiskStore::open(dir.path(), 1 << 20).unwrap_err();
    let Error::Locked {
        dir: locked,
        holder,
    } = &err
    else {
        panic!("expected Error::Locked, got {err}");
    };
    assert_eq!(locked, dir.path());
    assert!(
        holder.starts_with(&format!("pid {} on ", std::process::id())),
        "{holder}"
    );
    assert!(
        err.to_string()
            .contains("stop that engine or give this one another directory"),
        "{err}"
    );
    drop(first);
    let reopened = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert!(reopened.rejected().is_empty(), "{:?}", reopened.rejected());
}

#[test]
fn an_empty_directory_path_is_refused() {
    let err = DiskStore::open("", 1 << 20).unwrap_err();
    assert!(
        matches!(
            err,
            Error::StoreDir {
                reason: "the path is empty; name a directory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_lowered_capacity_evicts_whole_checkpoints_least_recently_written_first() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c", "d", "big", "e"];
    {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        for (idx, name) in names.iter().enumerate() {
            let n_tokens = if *name == "big" { 30 } else { 10 };
            let stored = checkpoint(name, 1, &tokens(n_tokens));
            store.put(stored).unwrap();
            // Write order, one second apart: the order eviction follows.
            let written = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + idx as u64);
            std::fs::File::options()
                .write(true)
                .open(store.manifest_path(&id(name)))
                .unwrap()
                .set_modified(written)
                .unwrap();
        }
    }
    // Room for two ten-token checkpoints: "big" alone is larger than that.
    let mut store = DiskStore::open(dir.path(), 2 * TEN_TOKEN_BYTES).unwrap();
    assert!(store.rejected().is_empty(), "{:?}", store.rejected());
    assert_eq!(
        store.evicted_at_open(),
        [id("a"), id("b"), id("big"), id("c")],
        "in write order, each when the next did not fit"
    );
    assert_eq!(store.stats().n_checkpoints, 2);
    for name in ["d", "e"] {
        assert_eq!(
            store.get(&id(name)).unwrap(),
            checkpoint(name, 1, &tokens(10))
        );
    }
    let kept = |name: &str| {
        [
            store.manifest_path(&id(name)),
            store.payload_path(&id(name), 1),
        ]
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
    };
    let mut expected: Vec<String> = [kept("d"), kept("e")].concat();
    expected.push("LOCK".to_string());
    expected.sort();
    assert_eq!(
        file_names(dir.path()),
        expected,
        "manifests and payloads are evicted together"
    );
    drop(store);
    let store = DiskStore::open(dir.path(), 2 * TEN_TOKEN_BYTES).unwrap();
    assert!(store.rejected().is_empty(), "{:?}", store.rejected());
    assert!(store.evicted_at_open().is_empty());
    assert_eq!(store.stats().n_checkpoints, 2);
}

#[test]
fn links_fifos_directories_and_oversized_manifests_are_reported_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let kept = checkpoint("kept", 1, &tokens(10));
    let linked = checkpoint("linked-payload", 1, &tokens(10));
    {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(kept.clone()).unwrap();
        store.put(linked.clone()).unwrap();
        // A payload replaced by a link to a copy of itself: same bytes, still not followed.
        let payload = store.payload_path(&linked.meta.id, 1);
        let copy = dir.path().join("elsewhere");
        std::fs::rename(&payload, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, &payload).unwrap();
    }
    let path = |name: &str| dir.path().join(name);
    std::os::unix::fs::symlink("/dev/zero", path("ckpt-61.manifest")).unwrap();
    let mkfifo = std::process::Command::new("mkfifo")
        .arg(path("ckpt-62.manifest"))
        .status()
        .unwrap();
    assert!(mkfifo.success());
    std::fs::create_dir(path("ckpt-63.manifest")).unwrap();
    let oversized = std::fs::File::create(path("ckpt-64.manifest")).unwrap();
    oversized.set_len(MANIFEST_BYTES_MAX as u64 + 1).unwrap();

    let mut store = open_within_ten_seconds(dir.path(), 1 << 20);
    let mut rejected: Vec<(String, String)> = store
        .rejected()
        .iter()
        .map(|file| {
            let name = file
                .path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, file.reason.clone())
        })
        .collect();
    rejected.sort();
    let expected = [
        (
            "ckpt-61.manifest",
            "it is a symbolic link, not a regular file",
        ),
        (
            "ckpt-62.manifest",
            "it is a FIFO, socket or device, not a regular file",
        ),
        ("ckpt-63.manifest", "it is a directory, not a regular file"),
        ("ckpt-64.manifest", "more than the limit of 16777216"),
        (
            "ckpt-6c696e6b65642d7061796c6f6164.manifest",
            "is unusable: it is a symbolic link",
        ),
    ];
    assert_eq!(rejected.len(), expected.len(), "{rejected:?}");
    for ((name, reason), (expected_name, expected_reason)) in rejected.iter().zip(expected) {
        assert_eq!(name, expected_name);
        assert!(reason.contains(expected_reason), "{name}: {reason}");
    }
    assert_eq!(store.stats().n_checkpoints, 1);
    assert_eq!(store.get(&kept.meta.id).unwrap(), kept);

    // A file replaced while the store is open is not followed either.
    let payload = store.payload_path(&kept.meta.id, 1);
    std::fs::remove_file(&payload).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &payload).unwrap();
    let err = store.get(&kept.meta.id).unwrap_err();
    let Error::Corrupt { path, reason } = &err else {
        panic!("expected Error::Corrupt, got {err}");
    };
    assert_eq!(path, &payload);
    assert!(reason.contains("symbolic link"), "{reason}");
}

#[test]
fn g6_every_single_byte_flip_of_a_manifest_is_rejected_by_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let original = checkpoint("flip", 1, &tokens(10));
    let manifest_path = {
        let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
        store.put(original.clone()).unwrap();
        store.manifest_path(&original.meta.id)
    };
    let bytes = std::fs::read(&manifest_path).unwrap();
    let mut n_flips = 0;
    for pos in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut flipped = bytes.clone();
            flipped[pos] ^= mask;
            std::fs::write(&manifest_path, &flipped).unwrap();
            let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(
                store.stats().n_checkpoints,
                0,
                "byte {pos} ^ {mask:#04x} loaded"
            );
            assert_eq!(store.rejected().len(), 1, "byte {pos} ^ {mask:#04x}");
            n_flips += 1;
        }
    }
    assert_eq!(n_flips, 3 * bytes.len());

    // The same flip in a store already open: `get` rejects it and drops it from the index.
    std::fs::write(&manifest_path, &bytes).unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.stats().n_checkpoints, 1);
    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    std::fs::write(&manifest_path, &flipped).unwrap();
    let err = store.get(&original.meta.id).unwrap_err();
    assert!(err.to_string().contains("fails its checksum"), "{err}");
    assert_eq!(store.meta(&original.meta.id), None);
}

/// Whether this process may write into a directory without write permission (root, `CAP_DAC_OVERRIDE`).
fn permissions_are_bypassed(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let bypassed = std::fs::write(&probe, b"x").is_ok();
    let _ignored = std::fs::remove_file(&probe);
    bypassed
}

#[test]
fn a_write_refused_for_permission_is_returned_with_its_cause_and_counted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    if permissions_are_bypassed(dir.path()) {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        eprintln!(
            "skipped: this process writes into read-only directories (root); \
             a_write_blocked_by_a_directory_is_returned_with_its_cause_and_counted covers the failure path"
        );
        return;
    }
    let err = store.put(checkpoint("denied", 1, &tokens(10))).unwrap_err();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let Error::Write { source, .. } = &err else {
        panic!("expected Error::Write, got {err}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert_eq!(store.stats().n_write_failures, 1);
    assert_eq!(store.stats().n_checkpoints, 0);
    store.put(checkpoint("allowed", 1, &tokens(10))).unwrap();
}

#[test]
fn a_write_blocked_by_a_directory_is_returned_with_its_cause_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    store.put(checkpoint("s", 1, &tokens(10))).unwrap();
    // A non-empty directory where generation 2's payload goes: the rename fails, for root too.
    let blocked = store.payload_path(&id("s"), 2);
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("occupant"), b"x").unwrap();
    let err = store.put(checkpoint("s", 2, &tokens(10))).unwrap_err();
    let Error::Write { path, source } = &err else {
        panic!("expected Error::Write, got {err}");
    };
    assert_eq!(path, &blocked);
    assert!(
        matches!(
            source.kind(),
            std::io::ErrorKind::IsADirectory | std::io::ErrorKind::DirectoryNotEmpty
        ),
        "{err}"
    );
    assert!(err.to_string().contains("free space on the disk"), "{err}");
    assert_eq!(store.stats().n_write_failures, 1);
    // The superseded generation is gone from the index and from the disk, nothing half-written remains.
    assert_eq!(store.meta(&id("s")), None);
    assert_eq!(
        file_names(dir.path()),
        ["LOCK", blocked.file_name().unwrap().to_str().unwrap()]
    );
    // The store goes on.
    std::fs::remove_dir_all(&blocked).unwrap();
    store.put(checkpoint("t", 1, &tokens(10))).unwrap();
    assert_eq!(store.stats().n_checkpoints, 1);
    drop(store);
    let store = DiskStore::open(dir.path(), 1 << 20).unwrap();
    assert!(store.rejected().is_empty(), "{:?}", store.rejected());
    assert_eq!(store.stats().n_checkpoints, 1);
    assert!(store.meta(&id("s")).is_none());
}
