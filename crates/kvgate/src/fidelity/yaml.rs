//! A reader for the small subset of YAML the measured experiments use: block mappings (`key: value`),
//! block sequences of mappings or scalars (`- key: value`), scalars, and `#` comments. Flow style (`{...}`,
//! `[...]`), anchors, multi-line scalars and tags are refused with the line they are on. The experiments'
//! `profile.yaml` files are JSON (a subset of YAML) and are read with `serde_json` instead.
//!
//! Why not a YAML crate: the files are three levels deep and use none of YAML's harder features, and a
//! hand-written reader of ~150 lines keeps the workspace's dependency list (and its lock file, which other
//! work edits) as it is.

/// One YAML value of the subset.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Yaml {
    /// A scalar, as written (quotes removed); `null` and `~` are `Null`.
    Scalar(String),
    /// `null`, `~` or nothing after the colon.
    Null,
    /// A block mapping, keys in file order.
    Map(Vec<(String, Yaml)>),
    /// A block sequence.
    Seq(Vec<Yaml>),
}

impl Yaml {
    /// The value at `path` (mapping keys separated by `.`), if every step exists.
    pub(super) fn get(&self, path: &str) -> Option<&Yaml> {
        path.split('.').try_fold(self, |node, key| match node {
            Yaml::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        })
    }

    /// The scalar text, if this is a scalar.
    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Yaml::Scalar(text) => Some(text),
            _ => None,
        }
    }

    /// The scalar as a number, if it is one.
    pub(super) fn as_f64(&self) -> Option<f64> {
        self.as_str()?.trim().parse().ok()
    }

    /// The sequence's items, if this is a sequence.
    pub(super) fn as_seq(&self) -> Option<&[Yaml]> {
        match self {
            Yaml::Seq(items) => Some(items),
            _ => None,
        }
    }
}

/// One meaningful line: its indentation and its text without the comment.
struct Line<'a> {
    number: usize,
    indent: usize,
    text: &'a str,
}

/// Parses `text`; errors name the line and say what the reader accepts.
pub(super) fn parse(text: &str) -> Result<Yaml, String> {
    let mut lines = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let without_comment = strip_comment(raw);
        if without_comment.trim().is_empty() || without_comment.trim() == "---" {
            continue;
        }
        if raw.contains('\t') {
            return Err(format!(
                "line {}: tabs are not allowed in YAML indentation",
                index + 1
            ));
        }
        let indent = without_comment.len() - without_comment.trim_start().len();
        lines.push(Line {
            number: index + 1,
            indent,
            text: without_comment.trim(),
        });
    }
    let mut at = 0;
    if lines.is_empty() {
        return Ok(Yaml::Map(Vec::new()));
    }
    let indent = lines[0].indent;
    let value = block(&lines, &mut at, indent)?;
    if let Some(line) = lines.get(at) {
        return Err(format!("line {}: unexpected indentation", line.number));
    }
    Ok(value)
}

/// The text of `raw` before a `#` that starts a comment (outside quotes).
fn strip_comment(raw: &str) -> &str {
    let mut quote = None;
    for (at, ch) in raw.char_indices() {
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(open), c) if c == open => quote = None,
            (None, '#') if at == 0 || raw[..at].ends_with(' ') => return &raw[..at],
            _ => {}
        }
    }
    raw
}

/// The block (mapping or sequence) whose lines start at `lines[*at]` with indentation `indent`.
fn block(lines: &[Line<'_>], at: &mut usize, indent: usize) -> Result<Yaml, String> {
    if lines[*at].text.starts_with("- ") || lines[*at].text == "-" {
        sequence(lines, at, indent)
    } else {
        mapping(lines, at, indent)
    }
}

fn sequence(lines: &[Line<'_>], at: &mut usize, indent: usize) -> Result<Yaml, String> {
    let mut items = Vec::new();
    while let Some(line) = lines.get(*at) {
        if line.indent < indent {
            break;
        }
        let dash = line.text.starts_with("- ") || line.text == "-";
        if line.indent == indent && !dash {
            // The mapping that holds this sequence at its own indentation goes on.
            break;
        }
        if line.indent > indent || !dash {
            return Err(format!(
                "line {}: expected a `- ` item of the sequence",
                line.number
            ));
        }
        let rest = line.text[1..].trim_start();
        let item_indent = indent + (line.text.len() - rest.len());
        if rest.is_empty() {
            *at += 1;
            items.push(nested(lines, at, indent)?);
        } else if split_key(rest).is_some() {
            // `- key: value` opens a mapping whose further keys sit under `key`.
            let mut entries = Vec::new();
            let (key, value) = split_key(rest).unwrap_or_default();
            *at += 1;
            entries.push((
                key.to_owned(),
                inline_or_nested(lines, at, item_indent, value, line.number)?,
            ));
            if let Some(next) = lines.get(*at)
                && next.indent == item_indent
                && !next.text.starts_with('-')
                && let Yaml::Map(more) = mapping(lines, at, item_indent)?
            {
                entries.extend(more);
            }
            items.push(Yaml::Map(entries));
        } else {
            items.push(scalar(rest, line.number)?);
            *at += 1;
        }
    }
    Ok(Yaml::Seq(items))
}

fn mapping(lines: &[Line<'_>], at: &mut usize, indent: usize) -> Result<Yaml, String> {
    let mut entries = Vec::new();
    while let Some(line) = lines.get(*at) {
        if line.indent < indent {
            break;
        }
        if line.indent > indent {
            return Err(format!("line {}: unexpected indentation", line.number));
        }
        let Some((key, value)) = split_key(line.text) else {
            return Err(format!("line {}: expected `key: value`", line.number));
        };
        *at += 1;
        entries.push((
            key.to_owned(),
            inline_or_nested(lines, at, indent, value, line.number)?,
        ));
    }
    Ok(Yaml::Map(entries))
}

/// The value after `key:`: the inline scalar, or the block on the following, deeper lines.
fn inline_or_nested(
    lines: &[Line<'_>],
    at: &mut usize,
    indent: usize,
    value: &str,
    number: usize,
) -> Result<Yaml, String> {
    if value.is_empty() {
        nested(lines, at, indent)
    } else {
        scalar(value, number)
    }
}

/// The block under a key or `-` at `indent`: deeper lines, or a sequence at the same indentation.
fn nested(lines: &[Line<'_>], at: &mut usize, indent: usize) -> Result<Yaml, String> {
    match lines.get(*at) {
        Some(next) if next.indent > indent => block(lines, at, next.indent),
        Some(next) if next.indent == indent && next.text.starts_with("- ") => {
            sequence(lines, at, indent)
        }
        _ => Ok(Yaml::Null),
    }
}

/// `key: value` (or `key:`), the key unquoted.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let colon = text
        .find(": ")
        .or_else(|| text.ends_with(':').then(|| text.len() - 1))?;
    let key = text[..colon].trim().trim_matches(|c| c == '"' || c == '\'');
    if key.is_empty() || key.contains(' ') && !text.starts_with(['"', '\'']) {
        return None;
    }
    Some((key, text[colon + 1..].trim()))
}

fn scalar(text: &str, number: usize) -> Result<Yaml, String> {
    match text {
        "[]" => return Ok(Yaml::Seq(Vec::new())),
        "{}" => return Ok(Yaml::Map(Vec::new())),
        _ => {}
    }
    if text.starts_with(['{', '[', '&', '*', '!', '|', '>']) {
        return Err(format!(
            "line {number}: flow collections, anchors, tags and block scalars are not supported; write the \
             value as plain block YAML"
        ));
    }
    let unquoted = if text.len() >= 2
        && ((text.starts_with('"') && text.ends_with('"'))
            || (text.starts_with('\'') && text.ends_with('\'')))
    {
        &text[1..text.len() - 1]
    } else {
        text
    };
    Ok(match unquoted {
        "null" | "~" | "" => Yaml::Null,
        _ => Yaml::Scalar(unquoted.to_owned()),
    })
}
