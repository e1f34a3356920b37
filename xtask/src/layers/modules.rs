//! The module check: inside the crates `ACYCLIC` names, no two modules of one folder import each other in a
//! cycle (issue 28). A module is a child of the folder (`x.rs`, or `x/` with its files). An import is a path
//! in code that resolves to a sibling: `super::x`, `self::x`, `crate::a::x`, or a name the parent's own
//! `use` brings in from a child (`use table::req;` makes `super::req` a path into `table`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Source roots whose module folders must be acyclic, relative to the repository root: the engine crate's
/// (issue 28). Not yet the others: `reservation`, `checkpoint-transfer` and `kvgate` have cycles today, most
/// through their `error` modules.
pub(crate) const ACYCLIC: &[&str] = &["crates/engine/src"];

type Folders = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

/// Every import cycle among sibling modules under `src`, one line each (the folder, then the modules).
pub(crate) fn cycles(src: &Path) -> Vec<String> {
    let files: Vec<(Vec<String>, String)> = crate::tidy::rust_files(src)
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).ok()?;
            Some((module_path(src, &file)?, strip_comments(&text)))
        })
        .collect();
    let mut folders = Folders::new();
    for (path, _) in &files {
        if let Some((child, parent)) = path.split_last() {
            folders
                .entry(parent.to_vec())
                .or_default()
                .entry(child.clone())
                .or_default();
        }
    }
    let aliases = parent_aliases(&files, &folders);
    for (path, text) in &files {
        for target in references(path, text) {
            let target = resolve_alias(&aliases, target);
            // The deepest folder both paths are in: an edge between its two children, if they differ.
            let common = path.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= path.len() || common >= target.len() {
                continue;
            }
            if let Some(children) = folders.get_mut(&path[..common])
                && children.contains_key(&target[common])
                && let Some(edges) = children.get_mut(&path[common])
            {
                edges.insert(target[common].clone());
            }
        }
    }
    let mut problems = Vec::new();
    for (folder, edges) in &folders {
        for cycle in strongly_connected(edges) {
            problems.push(format!(
                "{}: modules import each other in a cycle: {}",
                src.join(folder.join("/")).display(),
                cycle.join(" <-> ")
            ));
        }
    }
    problems
}

/// The module path of `file` under `src` (`engine/table/req.rs` -> `[engine, table, req]`; `lib.rs` and
/// `mod.rs` name their folder). `None` for files outside the module tree (`main.rs`, `bin/`).
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|first| first == "bin") || stem == "main" {
        return None;
    }
    if stem != "mod" && !(parts.is_empty() && stem == "lib") {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// `text` without `//` comments (doc comments name paths that are not imports).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The absolute module paths `text` (the file of module `path`) names: each `super::`, `self::` or `crate::`
/// path, and each name in a `{...}` group that follows one.
fn references(path: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut idx = 0;
    while idx < text.len() {
        let rest = &text[idx..];
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|prefix| rest.starts_with(prefix));
        let boundary =
            idx == 0 || !(bytes[idx - 1].is_ascii_alphanumeric() || bytes[idx - 1] == b'_');
        if !(starts && boundary) {
            idx += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let mut full = path.to_vec();
        let mut named = false;
        for segment in rest[..len].split("::") {
            match segment {
                "crate" if !named => full.clear(),
                "super" if !named => {
                    full.pop();
                }
                "self" | "" if !named => {}
                "" => {}
                name => {
                    full.push(name.to_string());
                    named = true;
                }
            }
        }
        if rest[len..].starts_with('{') {
            let end = rest[len..].find('}').map_or(rest.len(), |end| len + end);
            for item in rest[len + 1..end].split(',') {
                let first = item.trim().split("::").next().unwrap_or_default();
                if !first.is_empty() && first != "self" {
                    let mut target = full.clone();
                    target.push(first.to_string());
                    out.push(target);
                }
            }
        }
        if named {
            out.push(full);
        }
        idx += len.max(1);
    }
    out
}

/// Names a folder's own file brings in from one of its children with a plain `use child::...::name;`.
fn parent_aliases(
    files: &[(Vec<String>, String)],
    folders: &Folders,
) -> BTreeMap<Vec<String>, Vec<String>> {
    let mut aliases = BTreeMap::new();
    for (path, text) in files {
        let Some(children) = folders.get(path) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            let Some(used) = line
                .strip_prefix("use ")
                .or_else(|| line.strip_prefix("pub(crate) use "))
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            let used = used.strip_prefix("self::").unwrap_or(used);
            let segments: Vec<&str> = used.split("::").collect();
            if segments.len() >= 2
                && children.contains_key(segments[0])
                && let Some(name) = segments.last()
                && !name.contains(['{', '*', ' '])
            {
                let mut from = path.clone();
                from.push((*name).to_string());
                let mut to = path.clone();
                to.extend(segments.iter().map(|segment| segment.to_string()));
                aliases.insert(from, to);
            }
        }
    }
    aliases
}

/// `target` with a leading alias (a name the parent brought in) replaced by its path.
fn resolve_alias(aliases: &BTreeMap<Vec<String>, Vec<String>>, target: Vec<String>) -> Vec<String> {
    for len in (1..=target.len()).rev() {
        if let Some(to) = aliases.get(&target[..len]) {
            let mut resolved = to.clone();
            resolved.extend(target[len..].iter().cloned());
            return resolved;
        }
    }
    target
}

/// The strongly connected components of more than one module, each sorted (Tarjan's algorithm).
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, node: &'a str) {
        let idx = walk.index.len();
        walk.index.insert(node, idx);
        walk.low.insert(node, idx);
        walk.stack.push(node);
        for next in walk.edges.get(node).into_iter().flatten() {
            let next = next.as_str();
            let seen = walk.index.get(next).copied();
            let low = match seen {
                None => {
                    visit(walk, next);
                    walk.low.get(next).copied()
                }
                Some(next_idx) if walk.stack.contains(&next) => Some(next_idx),
                Some(_) => None,
            };
            if let (Some(low), Some(own)) = (low, walk.low.get_mut(node)) {
                *own = (*own).min(low);
            }
        }
        if walk.low.get(node) == walk.index.get(node) {
            let mut component = Vec::new();
            while let Some(top) = walk.stack.pop() {
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                walk.out.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    walk.out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir.to_path_buf()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn two_siblings_that_import_each_other_are_a_cycle_named_with_their_folder() {
        let src = write(
            &scratch("cycle"),
            &[
                ("lib.rs", "mod engine;\n"),
                ("engine/mod.rs", "mod step;\nmod pages;\n"),
                ("engine/step.rs", "use super::pages::AllocKind;\n"),
                ("engine/pages.rs", "fn f(plan: &super::step::Plan) {}\n"),
            ],
        );
        let problems = cycles(&src);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].ends_with("engine: modules import each other in a cycle: pages <-> step"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_path_through_the_parents_use_counts_and_one_way_imports_and_comments_do_not() {
        let src = write(
            &scratch("alias"),
            &[
                ("lib.rs", "mod engine;\nmod params;\n"),
                ("engine/mod.rs", "mod table;\nmod step;\nuse table::req;\n"),
                (
                    "engine/table.rs",
                    "pub(crate) mod req;\n// super::step::Plan is only named here\n",
                ),
                ("engine/table/req.rs", "use crate::params::Limits;\n"),
                ("engine/step.rs", "use super::req::{Req, Phase};\n"),
                ("params.rs", "use crate::error::Error;\n"),
            ],
        );
        assert_eq!(cycles(&src), Vec::<String>::new());
        write(
            &src,
            &[("engine/table/req.rs", "use super::super::step::Plan;\n")],
        );
        let problems = cycles(&src);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].ends_with("step <-> table"), "{problems:?}");
    }
}
