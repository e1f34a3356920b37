//! The agents workload: `n_agents` sessions, each a chain of turns. Every turn appends new input (a tool
//! result or a user message) to the whole previous context, including the previous response, and asks for a
//! response; the next turn arrives a think time after the previous one finished. Contexts grow every turn,
//! so by the later turns the sessions together outgrow the pool several times over.

use serde::{Deserialize, Serialize};

use super::token;
use crate::limits::{
    AGENT_TURNS_TOTAL_MAX, AGENTS_MAX, LIVE_AGENT_TURNS_TOTAL_MAX, LIVE_AGENTS_MAX, MODEL_LEN_MAX,
    SECONDS_MAX,
};

/// The longest mean think time, in seconds: 5e8. A drawn think time is up to one and a half times the mean,
/// so it stays within the limit on every time ([`SECONDS_MAX`]).
pub(crate) const THINK_S_MAX: f64 = SECONDS_MAX / 2.0;

/// Shape of an agents run. Every field has a default (see `Default`) and a unit in its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsSpec {
    /// Concurrent agent sessions.
    pub n_agents: u32,
    /// Turns per session.
    pub turns: u32,
    /// Tokens of the first turn's prompt (system prompt + task), per session.
    pub first_prompt_tokens: u32,
    /// New input tokens appended by each later turn (tool output, user input).
    pub turn_input_tokens: u32,
    /// Response tokens each turn generates (its length cap).
    pub response_tokens: u32,
    /// Think time between a turn finishing and the next one arriving, in seconds.
    pub think_s: f64,
    /// Seed of every token stream.
    pub seed: u64,
    /// The priority each turn asks the engine for.
    pub turn_priority: TurnPriority,
}

/// The priority a turn asks for. The engine admits by priority, then arrival (contract Q1), so this is the
/// admission order of the capacity waiters; it is the client's choice, the same under every policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum TurnPriority {
    /// Every turn the same priority: arrival order (FCFS).
    #[default]
    Arrival,
    /// A turn's priority is its index in its session: a session further along goes first, so the sessions
    /// progress unevenly and their contexts differ in size, instead of all growing together.
    Progress,
}

impl TurnPriority {
    /// The `RequestSpec::priority` of turn `turn` (larger first).
    pub fn of(self, turn: u32) -> i32 {
        match self {
            TurnPriority::Arrival => 0,
            TurnPriority::Progress => i32::try_from(turn).unwrap_or(i32::MAX),
        }
    }
}

impl Default for AgentsSpec {
    fn default() -> Self {
        AgentsSpec {
            n_agents: 8,
            turns: 32,
            first_prompt_tokens: 1024,
            turn_input_tokens: 32,
            response_tokens: 224,
            think_s: 2.0,
            seed: 1,
            turn_priority: TurnPriority::Arrival,
        }
    }
}

/// Why an agents spec cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentsSpecError {
    /// A count that must be positive is zero.
    #[error("agents: `{field}`{} must be at least 1, got 0", cli_option(.field))]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// A count is above its limit.
    #[error(
        "agents: `{field}`{} = {value} is above the limit of {limit}; {what_to_do}",
        cli_option(.field)
    )]
    AboveLimit {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        limit: u64,
        /// What to do instead.
        what_to_do: &'static str,
    },
    /// The think time is negative, not a number or above its limit.
    #[error("agents: `think_s` (--think-s) must be a number of seconds from 0 to 5e8, got {value}")]
    ThinkTime {
        /// The value given.
        value: String,
    },
}

/// The command-line options that set `field`, as an error shows them after the field's name (` (--agents)`),
/// or nothing for a field only the library sets.
fn cli_option(field: &str) -> &'static str {
    match field {
        "n_agents" => " (--agents)",
        "turns" => " (--turns)",
        "n_agents * turns" => " (--agents times --turns)",
        _ => "",
    }
}

impl AgentsSpec {
    /// Checks every field against its limits; the error names the first bad one.
    pub fn validate(&self) -> Result<(), AgentsSpecError> {
        let tokens = [
            ("first_prompt_tokens", self.first_prompt_tokens),
            ("turn_input_tokens", self.turn_input_tokens),
            ("response_tokens", self.response_tokens),
        ];
        for (field, value) in [("n_agents", self.n_agents), ("turns", self.turns)]
            .into_iter()
            .chain(tokens)
        {
            if value == 0 {
                return Err(AgentsSpecError::Zero { field });
            }
        }
        let turns_total = u64::from(self.n_agents) * u64::from(self.turns);
        let limits = [
            (
                "n_agents",
                u64::from(self.n_agents),
                u64::from(AGENTS_MAX),
                "run fewer sessions",
            ),
            (
                "n_agents * turns",
                turns_total,
                AGENT_TURNS_TOTAL_MAX,
                "run fewer sessions or turns",
            ),
        ]
        .into_iter()
        .chain(tokens.map(|(field, value)| {
            (
                field,
                u64::from(value),
                u64::from(MODEL_LEN_MAX),
                "no model is that long",
            )
        }));
        for (field, value, limit, what_to_do) in limits {
            if value > limit {
                return Err(AgentsSpecError::AboveLimit {
                    field,
                    value,
                    limit,
                    what_to_do,
                });
            }
        }
        if !(self.think_s.is_finite() && (0.0..=THINK_S_MAX).contains(&self.think_s)) {
            return Err(AgentsSpecError::ThinkTime {
                value: crate::limits::show(self.think_s),
            });
        }
        Ok(())
    }

    /// `validate`, then the tighter limits of a live run, where a real model computes every token on the CPU:
    /// at most `LIVE_AGENTS_MAX` sessions and `LIVE_AGENT_TURNS_TOTAL_MAX` turns in all.
    pub(crate) fn validate_live(&self) -> Result<(), AgentsSpecError> {
        self.validate()?;
        let limits = [
            (
                "n_agents",
                u64::from(self.n_agents),
                u64::from(LIVE_AGENTS_MAX),
            ),
            (
                "n_agents * turns",
                u64::from(self.n_agents) * u64::from(self.turns),
                LIVE_AGENT_TURNS_TOTAL_MAX,
            ),
        ];
        for (field, value, limit) in limits {
            if value > limit {
                return Err(AgentsSpecError::AboveLimit {
                    field,
                    value,
                    limit,
                    what_to_do: "a live run (--executor reference) computes every token on the CPU; \
                                 run fewer sessions or turns, or the simulated executor",
                });
            }
        }
        Ok(())
    }

    /// New input tokens of `turn` for `agent`: the first prompt, or a later turn's tool output / user input,
    /// drawn uniformly from half to one and a half times `turn_input_tokens`. Deterministic in the seed.
    pub(crate) fn input_len(&self, agent: u32, turn: u32) -> u32 {
        if turn == 0 {
            self.first_prompt_tokens
        } else {
            self.jitter(self.turn_input_tokens, agent, turn, 1)
        }
    }

    /// Output length cap of `turn` for `agent`: half to one and a half times `response_tokens`.
    pub(crate) fn response_len(&self, agent: u32, turn: u32) -> u32 {
        self.jitter(self.response_tokens, agent, turn, 2)
    }

    /// Think time after `turn` of `agent` finished, in seconds: half to one and a half times `think_s`.
    pub fn think_s(&self, agent: u32, turn: u32) -> f64 {
        let unit = f64::from(token(self.stream(agent, turn, 3), 0)) / f64::from(u32::MAX);
        self.think_s * (0.5 + unit)
    }

    /// Prompt length of `turn` for `agent`: every earlier input and response plus this turn's input.
    pub fn prompt_tokens(&self, agent: u32, turn: u32) -> u64 {
        (0..turn)
            .map(|t| u64::from(self.input_len(agent, t)) + u64::from(self.response_len(agent, t)))
            .sum::<u64>()
            + u64::from(self.input_len(agent, turn))
    }

    /// Prompt tokens over every turn of every session (one pass over the turns: a turn's prompt is the
    /// previous turn's prompt and response plus its input).
    pub(crate) fn total_prompt_tokens(&self) -> u64 {
        (0..self.n_agents)
            .map(|agent| {
                let mut context = 0u64;
                (0..self.turns)
                    .map(|turn| {
                        let prompt = context + u64::from(self.input_len(agent, turn));
                        context = prompt + u64::from(self.response_len(agent, turn));
                        prompt
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    /// The most any cache can serve, in percent of all prompt tokens: every prompt token but each turn's new
    /// input has been computed before (responses run to their cap: the simulated model never stops early).
    pub(crate) fn max_from_cache_pct(&self) -> f64 {
        let new: u64 = (0..self.n_agents)
            .flat_map(|agent| (0..self.turns).map(move |turn| (agent, turn)))
            .map(|(agent, turn)| u64::from(self.input_len(agent, turn)))
            .sum();
        let total = self.total_prompt_tokens();
        100.0 * (total - new) as f64 / total as f64
    }

    /// The new input tokens of `turn` for `agent`. Deterministic in (seed, agent, turn).
    pub(crate) fn new_input(&self, agent: u32, turn: u32) -> Vec<u32> {
        let stream = self.stream(agent, turn, 0);
        (0..u64::from(self.input_len(agent, turn)))
            .map(|i| token(stream, i))
            .collect()
    }

    /// The seed of stream `tag` of (agent, turn).
    fn stream(&self, agent: u32, turn: u32, tag: u64) -> u64 {
        self.seed ^ (u64::from(agent) << 40) ^ (u64::from(turn) << 8) ^ (tag << 4) ^ 0xA6E7
    }

    /// `mean` scaled by a factor drawn uniformly from [0.5, 1.5), at least 1.
    fn jitter(&self, mean: u32, agent: u32, turn: u32, tag: u64) -> u32 {
        let unit = f64::from(token(self.stream(agent, turn, tag), 0)) / f64::from(u32::MAX);
        ((f64::from(mean) * (0.5 + unit)).round() as u32).max(1)
    }
}

#[cfg(test)]
mod tests;
