//! The layering check: from `cargo metadata`, each crate depends only on the layers below it, and only the
//! facade re-exports other workspace crates; inside the crates `modules::ACYCLIC` names, no modules of one
//! folder import each other in a cycle.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod modules;

/// Each workspace library and the internal crates it may depend on (normal or dev dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    ("kv-pool", &[]),
    ("reservation", &["kv-pool"]),
    ("admission", &["kv-pool", "reservation"]),
    ("checkpoint-transfer", &["kv-pool"]),
    // The reference model computes into the pool's page storage through the caller's page tables; it knows
    // no engine type. The engine's `ReferenceExecutor` drives it.
    ("reference-model", &["kv-pool"]),
    (
        "engine",
        &[
            "kv-pool",
            "reservation",
            "admission",
            "checkpoint-transfer",
            "reference-model",
        ],
    ),
    (
        "kvgate",
        &[
            "kv-pool",
            "reservation",
            "admission",
            "checkpoint-transfer",
            "engine",
            // The live agents run (`run::live`) builds the reference model's shape from a preset.
            "reference-model",
            // `kvgate serve` tokenizes with the real model's tokenizer and chat template.
            "llama",
        ],
    ),
    // The real model (GGUF, the Llama forward pass, its tokenizer) sits beside kv-pool at the bottom: it
    // depends on nothing of ours; the facade plugs the engine's page tables into its KV interface
    // (`kvgate::model`).
    ("llama", &[]),
    // xtask is no layer; it asks kv-pool whether a CUDA driver is present (`cargo xtask gpu`).
    ("xtask", &["kv-pool"]),
];

/// Bindings to other languages: no layer. They sit above the facade, are built by their own tools (maturin
/// for the Python package) and no crate depends on them, so the layer table does not list them.
const BINDINGS: &[&str] = &["kvgate-py"];

pub(crate) fn check(root: &Path) -> Result<(), String> {
    let output = Command::new(crate::cargo_bin())
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed bad JSON: {e}"))?;
    let packages = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata has no packages")?;
    let internal: Vec<&str> = ALLOWED.iter().map(|(name, _)| *name).collect();
    let mut problems = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        if BINDINGS.contains(&name) {
            continue;
        }
        let Some((_, allowed)) = ALLOWED.iter().find(|(n, _)| *n == name) else {
            problems.push(format!(
                "crate `{name}` is not in the layer table of xtask/src/layers.rs"
            ));
            continue;
        };
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            if internal.contains(&dep_name) && !allowed.contains(&dep_name) {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}`, which is not a layer below it"
                ));
            }
        }
        if name != "kvgate" {
            let manifest = package["manifest_path"].as_str().unwrap_or_default();
            let src = Path::new(manifest).with_file_name("src");
            problems.extend(reexports(&src, name, &internal));
        }
    }
    for src in modules::ACYCLIC {
        problems.extend(modules::cycles(&root.join(src)));
    }
    if problems.is_empty() {
        eprintln!("xtask: layering ok");
        Ok(())
    } else {
        Err(format!(
            "layering check failed:\n  {}",
            problems.join("\n  ")
        ))
    }
}

/// `pub use <internal crate>` outside the facade. A path that starts with the crate's own name names one of
/// its modules (a crate is not in its own extern prelude), as `pub use engine::Engine` does in `engine`.
fn reexports(src: &Path, own: &str, internal: &[&str]) -> Vec<String> {
    let own = own.replace('-', "_");
    let mut problems = Vec::new();
    for file in crate::tidy::rust_files(src) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (line_idx, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if let Some(rest) = line.strip_prefix("pub use ") {
                let first = rest.split("::").next().unwrap_or_default().trim();
                if first != own && internal.iter().any(|c| c.replace('-', "_") == first) {
                    problems.push(format!(
                        "{}:{}: only the facade re-exports workspace crates",
                        file.display(),
                        line_idx + 1
                    ));
                }
            }
        }
    }
    problems
}
