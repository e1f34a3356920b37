//! Seeded Mooncake-format traces (`kvgate trace generate`): requests of chat sessions whose later turns extend
//! their earlier turns' hash ids, behind system prompts that many sessions share, arriving steadily (Poisson)
//! or in bursts. The same [`TraceShape`] always gives the same trace: the generator draws from its own
//! splitmix64 stream, never from a library whose sequence may change between versions.
//!
//! Hash ids are prefix hashes as in the published traces: an id stands for its block and everything before
//! it, so two requests that share an id at a position share every block before it too.

use std::fmt::Write as _;
use std::str::FromStr;

use super::{TRACE_BLOCK_TOKENS, TraceRequest};
use crate::error::{Error, Result};

/// Requests of a generated trace at most.
pub(crate) const GENERATED_REQUESTS_MAX: u32 = 1_000_000;

/// Mean arrival rate of a generated trace, in requests per second, at least and at most.
pub(crate) const RATE_PER_S_MIN: f64 = 0.01;
/// See [`RATE_PER_S_MIN`].
pub(crate) const RATE_PER_S_MAX: f64 = 1e6;

/// A prompt grows by later turns until it would pass this many tokens; then its session ends.
pub(crate) const SESSION_TOKENS_MAX: u32 = 65_536;

/// How long prompts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptLength {
    /// A system prompt of 1-2 blocks and a first message of 64-1,536 tokens; later turns add 32-512.
    Short,
    /// A system prompt of 2-6 blocks and a first message of 2,048-20,480 tokens (a document); later turns
    /// add 128-2,048.
    Long,
}

/// How much of a prompt an earlier request already computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Mostly single-turn sessions (1-2 turns) behind 64 system prompts, half the sessions behind none.
    Low,
    /// Sessions of 2-10 turns behind 4 shared system prompts; three requests in four continue a session.
    High,
}

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A Poisson process at the trace's rate.
    Steady,
    /// Bursts of 8-32 requests at 10 times the rate, then a pause, at the trace's rate on average.
    Bursty,
}

/// Everything that determines a generated trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceShape {
    /// Seed of the random stream.
    pub seed: u64,
    /// Requests in the trace, 1 to [`GENERATED_REQUESTS_MAX`].
    pub n_requests: u32,
    /// Prompt lengths.
    pub prompt: PromptLength,
    /// Prefix reuse.
    pub reuse: Reuse,
    /// Arrival process.
    pub arrival: Arrival,
    /// Mean arrivals per second, [`RATE_PER_S_MIN`] to [`RATE_PER_S_MAX`].
    pub rate_per_s: f64,
}

impl Default for TraceShape {
    /// Long prompts, high reuse, steady arrivals at 1 request a second; 1,000 requests, seed 0.
    fn default() -> Self {
        Self {
            seed: 0,
            n_requests: 1_000,
            prompt: PromptLength::Long,
            reuse: Reuse::High,
            arrival: Arrival::Steady,
            rate_per_s: 1.0,
        }
    }
}

impl FromStr for PromptLength {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "short" => Ok(Self::Short),
            "long" => Ok(Self::Long),
            _ => Err(invalid("--prompt", text, "short or long")),
        }
    }
}

impl FromStr for Reuse {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "low" => Ok(Self::Low),
            "high" => Ok(Self::High),
            _ => Err(invalid("--reuse", text, "low or high")),
        }
    }
}

impl FromStr for Arrival {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "steady" => Ok(Self::Steady),
            "bursty" => Ok(Self::Bursty),
            _ => Err(invalid("--arrival", text, "steady or bursty")),
        }
    }
}

fn invalid(name: &'static str, value: &str, allowed: &'static str) -> Error {
    Error::InvalidArgument {
        name,
        value: value.to_string(),
        allowed,
    }
}

/// The trace `shape` describes. Errors: `InvalidArgument` naming `--requests` or `--rate` when either is out
/// of its range; checked before anything is allocated.
pub fn generate(shape: &TraceShape) -> Result<Vec<TraceRequest>> {
    if !(1..=GENERATED_REQUESTS_MAX).contains(&shape.n_requests) {
        return Err(invalid(
            "--requests",
            &shape.n_requests.to_string(),
            "a number of requests from 1 to 1000000",
        ));
    }
    if !(RATE_PER_S_MIN..=RATE_PER_S_MAX).contains(&shape.rate_per_s) {
        return Err(invalid(
            "--rate",
            &shape.rate_per_s.to_string(),
            "a mean arrival rate from 0.01 to 1e6 requests per second",
        ));
    }
    let mut generator = Generator::new(shape);
    let mut requests = Vec::with_capacity(shape.n_requests as usize);
    for _ in 0..shape.n_requests {
        let timestamp = generator.next_arrival_ms();
        requests.push(generator.next_request(timestamp));
    }
    for request in &requests {
        // Within the limits by construction (rate, length cap); checked, not assumed.
        request
            .validate()
            .map_err(|message| Error::Internal(format!("generated a bad record: {message}")))?;
    }
    Ok(requests)
}

/// `requests` as JSON lines in the published traces' layout.
pub fn to_jsonl(requests: &[TraceRequest]) -> String {
    let mut text = String::new();
    for request in requests {
        let ids: Vec<String> = request.hash_ids.iter().map(u64::to_string).collect();
        let _ = writeln!(
            text,
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}",
            request.timestamp,
            request.input_length,
            request.output_length,
            ids.join(", ")
        );
    }
    text
}

/// A session with turns left: its last request, to extend.
struct Session {
    last: TraceRequest,
    turns_left: u32,
}

/// The generator's state: the random stream, the clock, the shared system prompts and the open sessions.
struct Generator {
    shape: TraceShape,
    state: u64,
    now_s: f64,
    /// Requests left in the current burst (bursty arrivals).
    burst_left: u32,
    next_id: u64,
    system_prompts: Vec<Vec<u64>>,
    open: Vec<Session>,
}

impl Generator {
    fn new(shape: &TraceShape) -> Self {
        let mut generator = Self {
            shape: *shape,
            state: shape.seed,
            now_s: 0.0,
            burst_left: 0,
            next_id: 0,
            system_prompts: Vec::new(),
            open: Vec::new(),
        };
        let (n_prompts, blocks) = match (shape.reuse, shape.prompt) {
            (Reuse::High, PromptLength::Short) => (4, (1, 2)),
            (Reuse::High, PromptLength::Long) => (4, (2, 6)),
            (Reuse::Low, PromptLength::Short) => (64, (1, 2)),
            (Reuse::Low, PromptLength::Long) => (64, (2, 6)),
        };
        for _ in 0..n_prompts {
            let n_blocks = generator.between(blocks.0, blocks.1);
            let ids = generator.fresh_ids(n_blocks);
            generator.system_prompts.push(ids);
        }
        generator
    }

    /// The next value of the splitmix64 stream.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u32, high: u32) -> u32 {
        let span = u64::from(high.saturating_sub(low)) + 1;
        low + (self.next_u64() % span) as u32
    }

    /// An exponential draw of mean `mean`.
    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    fn fresh_ids(&mut self, n: u32) -> Vec<u64> {
        let first = self.next_id;
        self.next_id += u64::from(n);
        (first..self.next_id).collect()
    }

    /// The next arrival time in milliseconds: Poisson at the rate, or bursts at ten times it with a pause
    /// after each that keeps the mean rate.
    fn next_arrival_ms(&mut self) -> u64 {
        let mean_gap_s = 1.0 / self.shape.rate_per_s;
        let gap_s = match self.shape.arrival {
            Arrival::Steady => self.exponential(mean_gap_s),
            Arrival::Bursty if self.burst_left == 0 => {
                let burst = self.between(8, 32);
                self.burst_left = burst - 1;
                // The pause before a burst of `burst` requests: 0.9 of their time at the mean rate.
                self.exponential(0.9 * f64::from(burst) * mean_gap_s)
            }
            Arrival::Bursty => {
                self.burst_left -= 1;
                self.exponential(0.1 * mean_gap_s)
            }
        };
        self.now_s += gap_s;
        (self.now_s * 1000.0) as u64
    }

    /// The next request: a later turn of an open session, or the first turn of a new one.
    fn next_request(&mut self, timestamp: u64) -> TraceRequest {
        let p_continue = match self.shape.reuse {
            Reuse::Low => 0.15,
            Reuse::High => 0.75,
        };
        if !self.open.is_empty() && self.unit() < p_continue {
            let idx = (self.next_u64() % self.open.len() as u64) as usize;
            let session = self.open.swap_remove(idx);
            if let Some(request) = self.later_turn(&session.last, timestamp) {
                if session.turns_left > 1 {
                    self.open.push(Session {
                        last: request.clone(),
                        turns_left: session.turns_left - 1,
                    });
                }
                return request;
            }
        }
        let request = self.first_turn(timestamp);
        let turns = match self.shape.reuse {
            Reuse::Low => self.between(1, 2),
            Reuse::High => self.between(2, 10),
        };
        if turns > 1 {
            self.open.push(Session {
                last: request.clone(),
                turns_left: turns - 1,
            });
        }
        request
    }

    fn output_length(&mut self) -> u32 {
        match self.shape.prompt {
            PromptLength::Short => self.between(16, 256),
            PromptLength::Long => self.between(64, 768),
        }
    }

    /// A new session's first request: a system prompt (shared, or none for half the sessions of low reuse)
    /// and a first message in fresh blocks.
    fn first_turn(&mut self, timestamp: u64) -> TraceRequest {
        let system = if self.shape.reuse == Reuse::Low && self.unit() < 0.5 {
            Vec::new()
        } else {
            let idx = (self.next_u64() % self.system_prompts.len() as u64) as usize;
            self.system_prompts.get(idx).cloned().unwrap_or_default()
        };
        let message = match self.shape.prompt {
            PromptLength::Short => self.between(64, 1_536),
            PromptLength::Long => self.between(2_048, 20_480),
        };
        let input_length = system.len() as u32 * TRACE_BLOCK_TOKENS + message;
        let mut hash_ids = system;
        let fresh = self.fresh_ids(message.div_ceil(TRACE_BLOCK_TOKENS));
        hash_ids.extend(fresh);
        let output_length = self.output_length();
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids,
        }
    }

    /// The turn after `last`: its prompt, its answer and a new message; `None` when that would pass
    /// [`SESSION_TOKENS_MAX`]. The last block of `last`, partial, keeps its id: a block's tokens are a prefix
    /// of its id's stream, so the longer block extends the shorter.
    fn later_turn(&mut self, last: &TraceRequest, timestamp: u64) -> Option<TraceRequest> {
        let message = match self.shape.prompt {
            PromptLength::Short => self.between(32, 512),
            PromptLength::Long => self.between(128, 2_048),
        };
        let input_length = last
            .input_length
            .checked_add(last.output_length)?
            .checked_add(message)?;
        if input_length > SESSION_TOKENS_MAX {
            return None;
        }
        let n_blocks = input_length.div_ceil(TRACE_BLOCK_TOKENS);
        let mut hash_ids = last.hash_ids.clone();
        let fresh = self.fresh_ids(n_blocks.saturating_sub(hash_ids.len() as u32));
        hash_ids.extend(fresh);
        let output_length = self.output_length();
        Some(TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids,
        })
    }
}

#[cfg(test)]
mod tests;
