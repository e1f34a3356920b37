//! Crash consistency: a child process (this test binary, re-run with `CHILD_DIR_ENV` set) writes, supersedes
//! and removes checkpoints in a loop, reporting each operation on stdout when it begins and once it
//! returned; the parent kills it with SIGKILL at a random (seeded) point, reopens the store on the same
//! directory and checks that no completed checkpoint was lost, nothing partial loads, and no orphan file is
//! left after that clean open. Then the next child goes on in the same directory.
#![allow(
    clippy::disallowed_methods,
    reason = "the crash test reads its seed and role from the environment"
)]
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the child reports its operations to the parent on stdout; the seed is printed"
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{checkpoint, tokens};
use crate::checkpoint::{Checkpoint, CheckpointId};
use crate::error::Error;
use crate::store::{CheckpointStore, DiskStore};

/// Set in the child: the store directory it writes.
const CHILD_DIR_ENV: &str = "KVGATE_CRASH_CHILD_DIR";
/// Set in the child: its round, the high bits of its generations and the seed of its choices.
const CHILD_ROUND_ENV: &str = "KVGATE_CRASH_CHILD_ROUND";
const ROUNDS: u64 = 20;
const N_IDS: u64 = 16;
const CAPACITY_BYTES: u64 = 1 << 30;

/// xorshift64*: seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The checkpoint the child writes for `id` at `generation`: its length, and so its bytes, vary with both.
fn expected(id: &str, generation: u64) -> Checkpoint {
    checkpoint(id, generation, &tokens(4 + (generation % 29) as u32))
}

#[test]
fn kill_9_at_random_points_loses_no_complete_checkpoint_loads_nothing_partial_leaves_no_orphan() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        let round = std::env::var(CHILD_ROUND_ENV).unwrap().parse().unwrap();
        child(Path::new(&dir), round);
    }
    let seed = std::env::var("KVGATE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6b76_6761_7465);
    eprintln!("crash test seed {seed} (set KVGATE_CRASH_SEED to replay)");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let mut committed: HashMap<String, u64> = HashMap::new();
    let (mut n_ops, mut n_killed_mid_operation) = (0, 0);
    for round in 1..=ROUNDS {
        let lines = run_and_kill(dir.path(), round, rng.next() % 50_000, round == 1);
        let (done, in_flight) = replay(&lines, &mut committed);
        n_ops += done;
        n_killed_mid_operation += u64::from(in_flight.is_some());
        check_reopen(dir.path(), &mut committed, in_flight.as_ref(), round);
    }
    eprintln!(
        "{ROUNDS} children killed, {n_killed_mid_operation} in the middle of an operation, after {n_ops} \
         completed operations"
    );
    assert!(
        n_ops > ROUNDS,
        "the children completed only {n_ops} operations"
    );
    assert!(
        n_killed_mid_operation > ROUNDS / 2,
        "only {n_killed_mid_operation} children were killed while writing"
    );
}

/// An operation the child began and did not report done: `(id, Some(generation))` for a put, `(id, None)`
/// for a remove.
type InFlight = (String, Option<u64>);

/// Applies the completed operations of `lines` to `committed`; returns how many completed and the one in
/// flight when the child was killed.
fn replay(lines: &[String], committed: &mut HashMap<String, u64>) -> (u64, Option<InFlight>) {
    let mut in_flight = None;
    let mut n_done = 0;
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["begin", "put", id, generation] => {
                in_flight = Some((id.to_string(), Some(generation.parse().unwrap())));
            }
            ["begin", "remove", id] => in_flight = Some((id.to_string(), None)),
            ["done", "put", id, generation] => {
                committed.insert(id.to_string(), generation.parse().unwrap());
                in_flight = None;
                n_done += 1;
            }
            ["done", "remove", id] => {
                committed.remove(id);
                in_flight = None;
                n_done += 1;
            }
            _ => {}
        }
    }
    (n_done, in_flight)
}

/// Reopens the store the killed child left: every completed checkpoint is there with its bytes (the one in
/// flight may or may not have happened), nothing else loads, nothing is rejected, and only the lock file and
/// the loaded checkpoints' files remain. `committed` becomes what the store holds.
fn check_reopen(
    dir: &Path,
    committed: &mut HashMap<String, u64>,
    in_flight: Option<&InFlight>,
    round: u64,
) {
    let mut store = DiskStore::open(dir, CAPACITY_BYTES).unwrap();
    assert!(
        store.rejected().is_empty(),
        "round {round}: {:?}",
        store.rejected()
    );
    let mut expected_ids: Vec<&String> = committed.keys().collect();
    if let Some((id, _)) = in_flight {
        expected_ids.push(id);
    }
    let mut holds: HashMap<String, u64> = HashMap::new();
    for id in expected_ids {
        let loaded = store
            .meta(&CheckpointId::new(id.as_str()).unwrap())
            .map(|meta| meta.generation);
        let done = committed.get(id).copied();
        let allowed = match in_flight {
            Some((flying, Some(generation))) if flying == id => vec![done, Some(*generation)],
            Some((flying, None)) if flying == id => vec![done, None],
            _ => vec![done],
        };
        assert!(
            allowed.contains(&loaded),
            "round {round}: {id} loaded {loaded:?}, allowed {allowed:?}"
        );
        if let Some(generation) = loaded {
            holds.insert(id.clone(), generation);
        }
    }
    assert_eq!(
        store.stats().n_checkpoints,
        holds.len(),
        "round {round}: only what the child wrote loads"
    );
    let mut expected_files = vec!["LOCK".to_string()];
    for (id, &generation) in &holds {
        let checkpoint_id = CheckpointId::new(id.as_str()).unwrap();
        assert_eq!(
            store.get(&checkpoint_id).unwrap(),
            expected(id, generation),
            "round {round}: {id} generation {generation} loads whole"
        );
        for path in [
            store.manifest_path(&checkpoint_id),
            store.payload_path(&checkpoint_id, generation),
        ] {
            expected_files.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    expected_files.sort();
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, expected_files, "round {round}: orphans left");
    *committed = holds;
}

/// Kills the child when dropped, so a failing parent leaves no process behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ignored = self.0.kill();
        let _ignored = self.0.wait();
    }
}

/// Runs one child on `dir`, kills it `delay_us` after its first operation began and returns every line it
/// printed. With `check_lock`, first checks that the directory is locked while the child runs.
fn run_and_kill(dir: &Path, round: u64, delay_us: u64, check_lock: bool) -> Vec<String> {
    let test_name = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, path)| path)
        .to_string()
        + "::kill_9_at_random_points_loses_no_complete_checkpoint_loads_nothing_partial_leaves_no_orphan";
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test_name, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir)
            .env(CHILD_ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = receiver
            .recv_timeout(Duration::from_secs(30))
            .expect("the child began no operation");
        let began = line.starts_with("begin");
        lines.push(line);
        if began {
            break;
        }
    }
    if check_lock {
        let err = DiskStore::open(dir, CAPACITY_BYTES).unwrap_err();
        let Error::Locked { holder, .. } = &err else {
            panic!("expected Error::Locked while the child runs, got {err}");
        };
        assert!(
            holder.starts_with(&format!("pid {} ", child.0.id())),
            "{holder}"
        );
    }
    std::thread::sleep(Duration::from_micros(delay_us));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    reader.join().unwrap();
    lines.extend(receiver.try_iter());
    lines
}

/// The child: writes, supersedes and removes checkpoints until killed.
fn child(dir: &Path, round: u64) -> ! {
    let mut store = DiskStore::open(dir, CAPACITY_BYTES).unwrap();
    let mut rng = Rng(round.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut stdout = std::io::stdout();
    for seq in 1.. {
        let id = format!("c{}", rng.next() % N_IDS);
        let checkpoint_id = CheckpointId::new(id.as_str()).unwrap();
        if rng.next().is_multiple_of(5) && store.meta(&checkpoint_id).is_some() {
            writeln!(stdout, "begin remove {id}").unwrap();
            store.remove(&checkpoint_id).unwrap();
            writeln!(stdout, "done remove {id}").unwrap();
        } else {
            let generation = (round << 32) | seq;
            writeln!(stdout, "begin put {id} {generation}").unwrap();
            store.put(expected(&id, generation)).unwrap();
            writeln!(stdout, "done put {id} {generation}").unwrap();
        }
        stdout.flush().unwrap();
    }
    unreachable!("the loop above never ends")
}
