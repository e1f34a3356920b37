//! The contract part of tidy: every behaviour id of `../shared/design/contract.md` (R1, C4, ...) has a row
//! in `docs/contract.md` that names a test, and a test function `fn <id lowercased>_...` somewhere under
//! `crates/` or `tests/`; every `file.rs::test` that `docs/contract.md` names is a test function in that
//! file. Without the shared contract (a checkout outside the project folder) only the second part runs.
//! A behaviour not built yet has a row whose last cell starts with `open:` and names the issue that builds
//! it; it needs no test, and tidy lists it on stderr so that it is never forgotten. An open row that a test
//! already pins is a problem: the row must say so. A row may extend a family of the specification past its
//! last id (`H9` after the specification's `H8`): a behaviour kvgate adds, held to the same rules (a test
//! named in its row, a test function `fn <id>_...`) and listed on stderr; any other id the specification
//! lacks is a problem.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The specification, relative to the repository root.
const SPEC: &str = "../shared/design/contract.md";

/// The per-test map of the contract, relative to the repository root.
const DOC: &str = "docs/contract.md";

/// Problems with `docs/contract.md`, one line each. Errors only when a file cannot be read.
pub(crate) fn check(root: &Path) -> Result<Vec<String>, String> {
    let doc_path = root.join(DOC);
    let doc = if doc_path.exists() {
        Some(read(&doc_path)?)
    } else {
        None
    };
    let mut problems = Vec::new();
    let spec_path = root.join(SPEC);
    if spec_path.exists() {
        let ids = spec_ids(&read(&spec_path)?);
        if ids.is_empty() {
            problems.push(format!("{SPEC}: no behaviour ids found (`- **R1** ...`)"));
        }
        let open = doc.as_deref().map(open_rows).unwrap_or_default();
        match &doc {
            Some(doc) => {
                let closed: Vec<String> = ids
                    .iter()
                    .filter(|id| !open.contains(*id))
                    .cloned()
                    .collect();
                let rows = row_refs(doc);
                problems.extend(missing_rows(&closed, &rows));
                let mut extensions = Vec::new();
                for id in rows.keys().filter(|id| !ids.contains(id)) {
                    if extends_a_family(&ids, id) {
                        extensions.push(id.clone());
                    } else {
                        problems.push(format!("{DOC}: row {id} is not a behaviour of {SPEC}"));
                    }
                }
                problems.extend(missing_rows(&extensions, &rows));
                let tests = workspace_test_fns(root)?;
                for id in &extensions {
                    let prefix = format!("{}_", id.to_lowercase());
                    if !tests.iter().any(|name| name.starts_with(&prefix)) {
                        problems.push(format!(
                            "contract {id}: no test function named `{prefix}...` under crates/ or tests/"
                        ));
                    }
                }
                if !extensions.is_empty() {
                    eprintln!(
                        "xtask: contract rows beyond {SPEC} (see {DOC}): {}",
                        extensions.join(" ")
                    );
                }
            }
            None => problems.push(format!("{DOC} is missing")),
        }
        let tests = workspace_test_fns(root)?;
        for id in &ids {
            let prefix = format!("{}_", id.to_lowercase());
            let pinned = tests.iter().any(|name| name.starts_with(&prefix));
            match (pinned, open.contains(id)) {
                (false, false) => problems.push(format!(
                    "contract {id}: no test function named `{prefix}...` under crates/ or tests/"
                )),
                (true, true) => problems.push(format!(
                    "{DOC}: contract {id} is marked open but a test `{prefix}...` pins it: name the test in its row"
                )),
                _ => {}
            }
        }
        if !open.is_empty() {
            let open: Vec<&str> = open.iter().map(String::as_str).collect();
            eprintln!(
                "xtask: contract behaviours still open (see {DOC}): {}",
                open.join(" ")
            );
        }
    } else {
        eprintln!("xtask: {SPEC} not found; skipping the contract id check");
    }
    if let Some(doc) = &doc {
        problems.extend(dangling_refs(root, doc)?);
    }
    Ok(problems)
}

/// Behaviour ids a specification defines, in order: list items that start with a bold id (`- **R1** ...`).
pub(super) fn spec_ids(spec: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for line in spec.lines() {
        let line = line.trim_start();
        let Some(rest) = line
            .strip_prefix("- **")
            .or_else(|| line.strip_prefix("* **"))
        else {
            continue;
        };
        let Some((id, _)) = rest.split_once("**") else {
            continue;
        };
        if is_contract_id(id) && !ids.iter().any(|known| known == id) {
            ids.push(id.to_string());
        }
    }
    ids
}

/// The table rows of the doc whose first cell is a behaviour id, with the `file.rs::test` references of
/// each row (ids listed twice merge).
pub(super) fn row_refs(doc: &str) -> BTreeMap<String, Vec<TestRef>> {
    let mut rows: BTreeMap<String, Vec<TestRef>> = BTreeMap::new();
    for line in doc.lines() {
        let Some(cells) = line.trim().strip_prefix('|') else {
            continue;
        };
        let first = cells.split('|').next().unwrap_or_default();
        let id = first.trim().trim_matches(['*', '`']).trim();
        if is_contract_id(id) {
            rows.entry(id.to_string())
                .or_default()
                .extend(test_refs(line));
        }
    }
    rows
}

/// Ids whose row's last cell starts with `open:` (a behaviour not built yet, with the issue that builds it).
pub(super) fn open_rows(doc: &str) -> BTreeSet<String> {
    let mut open = BTreeSet::new();
    for line in doc.lines() {
        let Some(cells) = line.trim().strip_prefix('|') else {
            continue;
        };
        let cells: Vec<&str> = cells.trim_end_matches('|').split('|').collect();
        let id = cells[0].trim().trim_matches(['*', '`']).trim();
        let last = cells.last().map_or("", |cell| cell.trim());
        if is_contract_id(id) && last.starts_with("open:") {
            open.insert(id.to_string());
        }
    }
    open
}

/// A test named in the doc: `file` (relative to the repository root) and the function's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TestRef {
    pub(super) file: String,
    pub(super) test: String,
}

/// Every `` `path/file.rs::test_name` `` code span of `text`, in order.
pub(super) fn test_refs(text: &str) -> Vec<TestRef> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (file, test) = span.trim().split_once(".rs::")?;
            let is_ident = !test.is_empty()
                && test.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !test.starts_with(|c: char| c.is_ascii_digit());
            (is_ident && !file.is_empty()).then(|| TestRef {
                file: format!("{file}.rs"),
                test: test.to_string(),
            })
        })
        .collect()
}

/// Names of the test functions of a Rust source: every `fn` whose attributes include `#[test]` (or
/// another `#[...test]`, such as in a `proptest!` block). A line of code between the attribute and a `fn`
/// (one ending in `;`, `{` or `}`) drops the attribute.
pub(super) fn test_fns(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut after_test_attr = false;
    for line in source.lines() {
        let line = line.trim();
        if line.starts_with("#[") && line.contains("test]") {
            after_test_attr = true;
            continue;
        }
        if !after_test_attr || line.starts_with("//") {
            continue;
        }
        if let Some(name) = fn_name(line) {
            names.push(name.to_string());
            after_test_attr = false;
        } else if line.ends_with(';') || line.ends_with('{') || line.ends_with('}') {
            after_test_attr = false;
        }
    }
    names
}

/// The name a line declares with `fn`, after any visibility and qualifiers.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// An id such as `R1` or `Q8`: upper-case letters, then digits.
/// Whether `id` extends a family of the specification's `ids` past its last id: the same letters, a
/// larger number (`H9` when the specification's H ids end at `H8`).
pub(super) fn extends_a_family(ids: &[String], id: &str) -> bool {
    let split = |id: &str| {
        let digits = id.trim_start_matches(|c: char| c.is_ascii_uppercase());
        let family = id[..id.len() - digits.len()].to_string();
        (family, digits.parse::<u64>().ok())
    };
    let (family, Some(number)) = split(id) else {
        return false;
    };
    let last = ids
        .iter()
        .map(|known| split(known))
        .filter(|(known, _)| *known == family)
        .filter_map(|(_, number)| number)
        .max();
    last.is_some_and(|last| number > last)
}

fn is_contract_id(text: &str) -> bool {
    let digits = text.trim_start_matches(|c: char| c.is_ascii_uppercase());
    digits.len() < text.len() && !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
}

fn missing_rows(ids: &[String], rows: &BTreeMap<String, Vec<TestRef>>) -> Vec<String> {
    let mut problems = Vec::new();
    for id in ids {
        match rows.get(id) {
            None => problems.push(format!("{DOC}: contract {id} has no row")),
            Some(refs) if refs.is_empty() => problems.push(format!(
                "{DOC}: the row of contract {id} names no `file.rs::test`"
            )),
            Some(_) => {}
        }
    }
    problems
}

/// References of the doc to files that do not exist or do not hold the named test.
fn dangling_refs(root: &Path, doc: &str) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let mut tests_by_file: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    for TestRef { file, test } in test_refs(doc) {
        if !tests_by_file.contains_key(&file) {
            let path = root.join(&file);
            let tests = if path.is_file() {
                Some(test_fns(&read(&path)?))
            } else {
                None
            };
            tests_by_file.insert(file.clone(), tests);
        }
        match &tests_by_file[&file] {
            None => problems.push(format!("{DOC}: `{file}::{test}`: no such file")),
            Some(tests) if !tests.contains(&test) => problems.push(format!(
                "{DOC}: `{file}::{test}`: the file has no test function `{test}`"
            )),
            Some(_) => {}
        }
    }
    Ok(problems)
}

/// Test function names of every `.rs` file under `crates/` and `tests/`.
fn workspace_test_fns(root: &Path) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for dir in ["crates", "tests"] {
        for file in super::rust_files(&root.join(dir)) {
            names.extend(test_fns(&read(&file)?));
        }
    }
    Ok(names)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}
