//! The Mooncake trace format (`../shared/workloads/mooncake/`): one JSON object per line with `timestamp`
//! (ms), `input_length`, `output_length` and `hash_ids` (prefix block hashes, 512 tokens a block; the last
//! block may be partial). A replay turns each request into token ids whose 512-token blocks are determined by
//! their hash ids, so prefix sharing is exactly what the trace says. Lines are read with a length limit, so a
//! hostile trace costs at most that much memory per line.

use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::path::Path;

use serde::Deserialize;

use super::token;
use crate::limits::{MODEL_LEN_MAX, SECONDS_MAX, TRACE_LINE_BYTES_MAX};

pub mod generate;

/// Tokens per hash block in the Mooncake traces.
pub(crate) const TRACE_BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// Arrival time in milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt length in tokens.
    pub input_length: u32,
    /// Response length in tokens.
    pub output_length: u32,
    /// Prefix block hashes, one per 512-token block of the prompt.
    pub hash_ids: Vec<u64>,
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file cannot be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The trace's path.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a valid trace record.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The trace's path.
        path: String,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace holds no request.
    #[error("trace {path} holds no request")]
    Empty {
        /// The trace's path.
        path: String,
    },
}

impl TraceRequest {
    /// Checks that the record is self-consistent and within the limits: a non-empty prompt no longer than any
    /// model, covered exactly by its hash blocks, arriving within the limit on every time.
    fn validate(&self) -> Result<(), String> {
        if self.input_length == 0 {
            return Err("input_length must be at least 1".into());
        }
        if self.input_length > MODEL_LEN_MAX {
            return Err(format!(
                "input_length {} is above the limit of {MODEL_LEN_MAX} tokens",
                self.input_length
            ));
        }
        let timestamp_ms_max = SECONDS_MAX as u64 * 1000;
        if self.timestamp > timestamp_ms_max {
            return Err(format!(
                "timestamp {} ms is above the limit of {timestamp_ms_max} ms",
                self.timestamp
            ));
        }
        let blocks_needed = self.input_length.div_ceil(TRACE_BLOCK_TOKENS) as usize;
        if self.hash_ids.len() != blocks_needed {
            return Err(format!(
                "input_length {} needs {blocks_needed} hash blocks of {TRACE_BLOCK_TOKENS} tokens, got {}",
                self.input_length,
                self.hash_ids.len()
            ));
        }
        Ok(())
    }

    /// The prompt's token ids: block `i` holds the first tokens of the stream named by `hash_ids[i]`. The
    /// vector has room for the output as well (up to the prompt's own length, the room
    /// `RequestSpec::keyed` makes), so the engine appends it without copying the prompt.
    pub fn prompt(&self) -> Vec<u32> {
        let room = self.output_length.max(1).min(self.input_length);
        let mut tokens = Vec::with_capacity(self.input_length as usize + room as usize);
        engine::PromptSource::generate(self, &mut tokens);
        tokens
    }
}

/// A trace request generates its prompt from its hash ids, so a replay's waiting requests hold those
/// instead of their tokens (`RequestSpec::keyed_from_source`).
impl engine::PromptSource for TraceRequest {
    fn generate(&self, out: &mut Vec<u32>) {
        out.reserve(self.input_length as usize);
        self.generate_from(0, out);
    }

    /// Block `i` holds the first tokens of the stream named by `hash_ids[i]`.
    fn generate_from(&self, start: usize, out: &mut Vec<u32>) {
        let (len, block) = (self.input_length as usize, TRACE_BLOCK_TOKENS as usize);
        let mut pos = start;
        while pos < len {
            let (idx, offset) = (pos / block, pos % block);
            let Some(&hash_id) = self.hash_ids.get(idx) else {
                break;
            };
            let end = (idx * block + block).min(len);
            let (first, last) = (offset as u64, (end - idx * block) as u64);
            out.extend((first..last).map(|i| token(hash_id.wrapping_add(0x5EED_0000_0000), i)));
            pos = end;
        }
    }

    /// Block `i` is a function of `hash_ids[i]` alone (and the offset in it), as `generate` makes it.
    fn segments(&self) -> Option<engine::Segments<'_>> {
        Some(engine::Segments {
            ids: &self.hash_ids,
            tokens: TRACE_BLOCK_TOKENS,
            len: self.input_length as usize,
        })
    }
}

/// Reads a whole trace. Every malformed line is an error naming its line number; nothing panics.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_trace(std::io::BufReader::new(file), &shown)
}

/// Parses a trace from any reader; `path` only names it in errors. A line longer than
/// [`TRACE_LINE_BYTES_MAX`] is an error, found without reading more of it than the limit.
pub fn parse_trace(mut reader: impl BufRead, path: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    let mut last_timestamp = 0;
    let mut line = Vec::new();
    for line_no in 1.. {
        line.clear();
        let limit = TRACE_LINE_BYTES_MAX as u64 + 1;
        let n_read = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .map_err(|source| TraceError::Io {
                path: path.to_string(),
                source,
            })?;
        if n_read == 0 {
            break;
        }
        let bad = |message: String| TraceError::Line {
            path: path.to_string(),
            line: line_no,
            message,
        };
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() > TRACE_LINE_BYTES_MAX {
            return Err(bad(format!(
                "the line is longer than the limit of {TRACE_LINE_BYTES_MAX} bytes"
            )));
        }
        if text.trim_ascii().is_empty() {
            continue;
        }
        // A line that is not UTF-8 is an error naming its line and column.
        let text = std::str::from_utf8(text).map_err(|e| {
            bad(format!(
                "not UTF-8 text (invalid byte at column {}); a trace is JSON lines",
                e.valid_up_to() + 1
            ))
        })?;
        let request: TraceRequest = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        request.validate().map_err(bad)?;
        if request.timestamp < last_timestamp {
            return Err(bad(format!(
                "timestamp {} is earlier than the previous line's {last_timestamp}; a trace is in arrival order",
                request.timestamp
            )));
        }
        last_timestamp = request.timestamp;
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_string(),
        });
    }
    Ok(requests)
}

/// The trace's theoretical maximum prompt cache hit, in percent of all prompt tokens: for each request the
/// leading run of blocks already seen in earlier requests, capped at its input length. Computed from the
/// hash ids alone, independently of any engine: no cache of any size can serve more.
pub fn theoretical_max_hit_pct(requests: &[TraceRequest]) -> f64 {
    let (hit, total) = theoretical_max_hit_tokens(requests);
    if total == 0 {
        0.0
    } else {
        100.0 * hit as f64 / total as f64
    }
}

/// `(tokens that could be cache hits, all prompt tokens)` behind [`theoretical_max_hit_pct`].
pub(crate) fn theoretical_max_hit_tokens(requests: &[TraceRequest]) -> (u64, u64) {
    let mut seen = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for request in requests {
        let leading = request
            .hash_ids
            .iter()
            .take_while(|id| seen.contains(*id))
            .count() as u64;
        hit += (leading * u64::from(TRACE_BLOCK_TOKENS)).min(u64::from(request.input_length));
        total += u64::from(request.input_length);
        seen.extend(request.hash_ids.iter().copied());
    }
    (hit, total)
}

#[cfg(test)]
mod tests;
