//! Function length: no function in library code runs over `MAX_FN_LINES` lines (issue 28; TigerBeetle keeps
//! to 70). Library code is every crate's `src/` except binaries (`main.rs`, `src/bin/`) and tests (files
//! named `tests.rs` or `*_tests.rs`, folders named `tests`, and items under `#[cfg(test)]`). A function's length counts its
//! lines from the one naming it to its closing brace.

/// The longest a library function may be, in lines.
pub(crate) const MAX_FN_LINES: usize = 80;

/// Whether `shown` (a path from the root) is library code this check reads.
pub(crate) fn is_library(shown: &str) -> bool {
    let Some((_, in_src)) = shown.split_once("/src/") else {
        return false;
    };
    shown.starts_with("crates/")
        && !in_src.starts_with("bin/")
        && in_src != "main.rs"
        && !in_src
            .split('/')
            .any(|part| part == "tests" || part == "tests.rs" || part.ends_with("_tests.rs"))
}

/// `text` with comments, string and character literals blanked (newlines kept), so braces in them do
/// not count. Raw strings with up to three `#` are understood; a lifetime is not a literal.
pub(crate) fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let rest = &chars[i..];
        let end = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            closing(rest, &['*', '/'], 2)
        } else if rest.first() == Some(&'"') {
            quoted(rest, '"')
        } else if let Some(hashes) = raw_string_hashes(rest) {
            let mut close = vec!['"'];
            close.extend(std::iter::repeat_n('#', hashes));
            closing(rest, &close, hashes + 2)
        } else if rest.first() == Some(&'\'') && is_char_literal(rest) {
            quoted(rest, '\'')
        } else {
            out.push(chars[i]);
            i += 1;
            continue;
        };
        for &c in &rest[..end.min(rest.len())] {
            blank(&mut out, c);
        }
        i += end.max(1);
    }
    out
}

/// The length of `rest` up to and including the first `close` at or after `from`.
fn closing(rest: &[char], close: &[char], from: usize) -> usize {
    (from..rest.len())
        .find(|&j| rest[j..].starts_with(close))
        .map_or(rest.len(), |j| j + close.len())
}

/// The length of the literal opening `rest` with `quote`, escapes honoured.
fn quoted(rest: &[char], quote: char) -> usize {
    let mut j = 1;
    while j < rest.len() {
        match rest[j] {
            '\\' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    rest.len()
}

/// `Some(number of #)` when `rest` opens a raw string (`r"`, `r#"`, `br##"`, ...).
fn raw_string_hashes(rest: &[char]) -> Option<usize> {
    let after_prefix = match rest {
        ['r', ..] => 1,
        ['b', 'r', ..] => 2,
        _ => return None,
    };
    let hashes = rest[after_prefix..]
        .iter()
        .take_while(|&&c| c == '#')
        .count();
    (rest.get(after_prefix + hashes) == Some(&'"')).then_some(hashes)
}

/// Whether the `'` opening `rest` starts a character literal rather than a lifetime.
fn is_char_literal(rest: &[char]) -> bool {
    matches!(rest, ['\'', '\\', ..] | ['\'', _, '\'', ..])
}

/// Each function of `text` longer than `MAX_FN_LINES`: (its first line, its name, its length in lines).
/// Items under `#[cfg(test)]` are skipped whole.
pub(crate) fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if line.starts_with("#[cfg(test)]") {
            i = item_end(&lines, i + 1) + 1;
            continue;
        }
        if let Some(name) = fn_name(line) {
            let end = item_end(&lines, i);
            let length = end + 1 - i;
            if length > MAX_FN_LINES {
                long.push((i + 1, name, length));
            }
            // Nested functions count inside their parent only.
            i = end + 1;
            continue;
        }
        i += 1;
    }
    long
}

/// The name of the function `line` declares, if it declares one.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.next() {
        match word {
            "fn" => {
                let name = words.next()?;
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            "pub" | "const" | "async" | "unsafe" | "extern" | "default" => {}
            w if w.starts_with("pub(") || w.starts_with('"') => {}
            _ => return None,
        }
    }
    None
}

/// The line on which the item starting at `start` ends: its closing brace, or its `;` when it has no body.
fn item_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0usize;
    let mut brackets = 0usize;
    let mut opened = false;
    for (j, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth = depth.saturating_sub(1),
                '(' | '[' => brackets += 1,
                ')' | ']' => brackets = brackets.saturating_sub(1),
                ';' if !opened && depth == 0 && brackets == 0 => return j,
                _ => {}
            }
        }
        if opened && depth == 0 {
            return j;
        }
    }
    lines.len().saturating_sub(1)
}

/// The problems of the file at `shown` with contents `text`: one per long function.
pub(crate) fn check_file(shown: &str, text: &str) -> Vec<String> {
    if !is_library(shown) {
        return Vec::new();
    }
    long_functions(text)
        .into_iter()
        .map(|(line, name, length)| {
            format!(
                "{shown}:{line}: `fn {name}` is {length} lines; library functions stay within \
                 {MAX_FN_LINES} (split it by job)"
            )
        })
        .collect()
}
