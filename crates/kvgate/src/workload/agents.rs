//! The agents workload: `n_agents` sessions, each a chain of turns. Every turn appends new input (a tool
//! result or a user message) to the whole previous context, including the previous response, and asks for a
//! response; the next turn arrives a think time after the previous one finished. Contexts grow every turn,
//! so by the later turns the sessions together outgrow the pool several times over.

use serde::{Deserialize, Serialize};

use super::token;

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
        }
    }
}

/// Why an agents spec cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentsSpecError {
    /// A count that must be positive is zero.
    #[error("agents: `{field}` must be at least 1, got 0")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// The think time is negative or not a number.
    #[error("agents: `think_s` must be a finite number >= 0, got {value}")]
    ThinkTime {
        /// The value given.
        value: String,
    },
}

impl AgentsSpec {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), AgentsSpecError> {
        for (field, value) in [
            ("n_agents", self.n_agents),
            ("turns", self.turns),
            ("first_prompt_tokens", self.first_prompt_tokens),
            ("turn_input_tokens", self.turn_input_tokens),
            ("response_tokens", self.response_tokens),
        ] {
            if value == 0 {
                return Err(AgentsSpecError::Zero { field });
            }
        }
        if !(self.think_s.is_finite() && self.think_s >= 0.0) {
            return Err(AgentsSpecError::ThinkTime {
                value: self.think_s.to_string(),
            });
        }
        Ok(())
    }

    /// Prompt length of turn `turn` (0-based), assuming every earlier response ran to its cap.
    pub fn prompt_tokens(&self, turn: u32) -> u64 {
        let turn = u64::from(turn);
        u64::from(self.first_prompt_tokens)
            + turn * (u64::from(self.turn_input_tokens) + u64::from(self.response_tokens))
    }

    /// Prompt tokens over every turn of every session, assuming every response ran to its cap.
    pub fn total_prompt_tokens(&self) -> u64 {
        u64::from(self.n_agents)
            * (0..self.turns)
                .map(|turn| self.prompt_tokens(turn))
                .sum::<u64>()
    }

    /// The most any cache can serve, in percent of all prompt tokens: every token but the first prompts and
    /// each turn's new input has been computed before. Responses are assumed to run to their cap.
    pub fn max_from_cache_pct(&self) -> f64 {
        let new_per_agent = u64::from(self.first_prompt_tokens)
            + u64::from(self.turns - 1) * u64::from(self.turn_input_tokens);
        let total = self.total_prompt_tokens();
        100.0 * (total - u64::from(self.n_agents) * new_per_agent) as f64 / total as f64
    }

    /// New input tokens of `turn` for `agent`: the first turn's whole prompt, or the appended input of a
    /// later one. Deterministic in (seed, agent, turn).
    pub fn new_input(&self, agent: u32, turn: u32) -> Vec<u32> {
        let n = if turn == 0 {
            self.first_prompt_tokens
        } else {
            self.turn_input_tokens
        };
        let stream = self.seed ^ (u64::from(agent) << 32) ^ (u64::from(turn) << 8) ^ 0xA6E7;
        (0..u64::from(n)).map(|i| token(stream, i)).collect()
    }
}

#[cfg(test)]
mod tests;
