//! `GroupConfig`: one cache group as a config file writes it. The kind is `kv_pool::GroupKind` itself (the
//! workspace's one enum of group kinds); the file's form, a table with a `kind` tag and the kind's own fields,
//! is read through `GroupFields`, a flat record that rejects unknown fields and fields of another kind.

use kv_pool::GroupKind;
use serde::{Deserialize, Serialize};

/// One cache group: its kind, and the bytes of one of its pages (`None`: the preset's KV bytes per token times
/// tokens per page). In a file: `{ kind = "full" }`, `{ kind = "sliding_window", window_tokens = 128,
/// retained_tail_tokens = 16 }` (the tail defaults to 0), `{ kind = "chunked_local", chunk_tokens = 256 }`,
/// `{ kind = "recurrent" }` or `{ kind = "auxiliary", pages = 1 }`, each with an optional `bytes_per_page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "GroupFields", into = "GroupFields")]
pub struct GroupConfig {
    /// How the group's layers use pages.
    pub kind: GroupKind,
    /// Bytes of one page of this group.
    pub bytes_per_page: Option<u64>,
}

impl GroupConfig {
    /// A group of `kind` with the preset's page size.
    pub fn new(kind: GroupKind) -> GroupConfig {
        GroupConfig {
            kind,
            bytes_per_page: None,
        }
    }
}

/// The kinds' names in a file, in `GroupKind`'s order.
const KIND_NAMES: [&str; 5] = [
    "full",
    "sliding_window",
    "chunked_local",
    "recurrent",
    "auxiliary",
];

/// A group as a file writes it: every kind's fields, each optional.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupFields {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retained_tail_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunk_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pages: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bytes_per_page: Option<u64>,
}

impl TryFrom<GroupFields> for GroupConfig {
    type Error = String;

    /// Errors: an unknown kind, a kind's required field missing, or a field of another kind given.
    fn try_from(fields: GroupFields) -> std::result::Result<GroupConfig, String> {
        let GroupFields {
            kind,
            window_tokens,
            retained_tail_tokens,
            chunk_tokens,
            pages,
            bytes_per_page,
        } = fields;
        let required = |value: Option<u32>, name: &str| {
            value.ok_or_else(|| format!("a group of kind `{kind}` needs `{name}`"))
        };
        let (group, allowed): (GroupKind, &[&str]) = match kind.as_str() {
            "full" => (GroupKind::Full, &[]),
            "sliding_window" => (
                GroupKind::SlidingWindow {
                    window_tokens: required(window_tokens, "window_tokens")?,
                    retained_tail_tokens: retained_tail_tokens.unwrap_or(0),
                },
                &["window_tokens", "retained_tail_tokens"],
            ),
            "chunked_local" => (
                GroupKind::ChunkedLocal {
                    chunk_tokens: required(chunk_tokens, "chunk_tokens")?,
                },
                &["chunk_tokens"],
            ),
            "recurrent" => (GroupKind::Recurrent, &[]),
            "auxiliary" => (
                GroupKind::Auxiliary {
                    pages: required(pages, "pages")?,
                },
                &["pages"],
            ),
            other => {
                let expected = KIND_NAMES.map(|name| format!("`{name}`")).join(", ");
                return Err(format!(
                    "unknown variant `{other}`, expected one of {expected}"
                ));
            }
        };
        let given = [
            ("window_tokens", window_tokens.is_some()),
            ("retained_tail_tokens", retained_tail_tokens.is_some()),
            ("chunk_tokens", chunk_tokens.is_some()),
            ("pages", pages.is_some()),
        ];
        if let Some((name, _)) = given
            .iter()
            .find(|(name, given)| *given && !allowed.contains(name))
        {
            return Err(format!("a group of kind `{kind}` has no field `{name}`"));
        }
        Ok(GroupConfig {
            kind: group,
            bytes_per_page,
        })
    }
}

impl From<GroupConfig> for GroupFields {
    fn from(group: GroupConfig) -> GroupFields {
        let mut fields = GroupFields {
            kind: String::new(),
            window_tokens: None,
            retained_tail_tokens: None,
            chunk_tokens: None,
            pages: None,
            bytes_per_page: group.bytes_per_page,
        };
        let kind_idx = match group.kind {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow {
                window_tokens,
                retained_tail_tokens,
            } => {
                fields.window_tokens = Some(window_tokens);
                fields.retained_tail_tokens = Some(retained_tail_tokens);
                1
            }
            GroupKind::ChunkedLocal { chunk_tokens } => {
                fields.chunk_tokens = Some(chunk_tokens);
                2
            }
            GroupKind::Recurrent => 3,
            GroupKind::Auxiliary { pages } => {
                fields.pages = Some(pages);
                4
            }
        };
        fields.kind = KIND_NAMES[kind_idx].to_string();
        fields
    }
}
