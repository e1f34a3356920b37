//! The live agents run on the real model (`kvgate agents --executor model`, issue 29 item 6): each session
//! is a chat (a system prompt shared by every session, a task of its own, then follow-up questions), the
//! model's own greedy answers part of the next turn's context, served by the engine with the model's keys
//! and values in the pool's pages ([`crate::model::ModelExecutor`]) on the wall clock, less the time
//! `--verify` spends recomputing restores ([`crate::model::VerifyExcludedClock`]).
//!
//! An answer ends at the model's end-of-turn token, or after `answer_tokens` tokens, where the driver
//! closes the turn itself. The engine knows no stop token of the model, so it computes the whole
//! allowance; the tokens after an end-of-turn are dropped from the context and the next turn restores the
//! checkpoint's pages as far as the prefix agrees.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine::{ClockKind, CopyEngineKind, Engine, EngineParams, Policy, RequestSpec, RunMetrics};
use kv_pool::Timestamp;

use super::{Observer, Progress, submit_or_reject};
use crate::builder::engine_builder;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::limits::duration_s;
use crate::model::{LoadedModel, ModelExecutor, VerifyExcludedClock, VerifyTime};

/// Usable pages of a model run's pool unless told otherwise: 16 pages of 16 tokens (256 tokens, 11 MiB),
/// which four sessions of up to ~220 tokens outgrow about three times over by their last turns, while one
/// session and its continuation always fit.
pub const MODEL_POOL_PAGES: u32 = 16;
/// Longest context of a model run, in tokens.
pub(crate) const MODEL_MAX_MODEL_LEN: u32 = 1024;
/// Running slots of a model run (the `oracle` pool holds each at the model run's length: 325 pages).
pub(crate) const MODEL_MAX_RUNNING: u32 = 4;
/// Most sessions of a model run.
pub(crate) const MODEL_AGENTS_MAX: u32 = 8;
/// Most turns per session of a model run.
pub(crate) const MODEL_TURNS_MAX: u32 = 8;
/// Most answer tokens a turn of a model run.
pub(crate) const MODEL_ANSWER_TOKENS_MAX: u32 = 128;

/// The system prompt every session starts with.
pub(crate) const SYSTEM_PROMPT: &str = "You are a careful assistant on a small software team. Answer in one or two \
short sentences, plainly, without lists or code unless asked. If a question is unclear, say what you would \
need to know.";

/// Each session's first question (session `i` takes `TASKS[i % len]`).
const TASKS: [&str; 8] = [
    "Our web service answers slowly after a deploy. What should we look at first?",
    "Explain what a cache eviction policy is, for a new teammate.",
    "We keep losing messages between two services. What could cause that?",
    "Should a small team write its own database migration tool?",
    "What is the difference between a process and a thread?",
    "How do I explain technical debt to a manager?",
    "Why would a test pass on my laptop and fail in CI?",
    "What makes a good code review comment?",
];

/// Follow-up questions (turn `t` of session `i` takes `FOLLOW_UPS[(i + t) % len]`).
const FOLLOW_UPS: [&str; 6] = [
    "Can you say that more simply?",
    "What is the most common mistake there?",
    "Give me one concrete next step.",
    "How would I know it worked?",
    "What would you do differently on a large team?",
    "Summarise your advice in one sentence.",
];

/// The sessions of a model run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChatSpec {
    /// Sessions.
    pub n_agents: u32,
    /// Turns per session.
    pub turns: u32,
    /// Most tokens of one answer.
    pub answer_tokens: u32,
    /// Seconds between an answer and the session's next question.
    pub think_s: f64,
}

impl Default for ChatSpec {
    /// Four sessions of three turns, answers of at most 16 tokens, 0.5 s think time (a few minutes for the
    /// four policies on 2 cores).
    fn default() -> ChatSpec {
        ChatSpec {
            n_agents: 4,
            turns: 3,
            answer_tokens: 16,
            think_s: 0.5,
        }
    }
}

impl ChatSpec {
    /// Checks the sizes against the model run's limits. Errors: `InvalidArgument` naming the option.
    pub fn validate(&self) -> Result<()> {
        let checks = [
            (
                "--agents",
                self.n_agents,
                MODEL_AGENTS_MAX,
                "1 to 8 sessions with --executor model",
            ),
            (
                "--turns",
                self.turns,
                MODEL_TURNS_MAX,
                "1 to 8 turns with --executor model",
            ),
            (
                "answer tokens",
                self.answer_tokens,
                MODEL_ANSWER_TOKENS_MAX,
                "1 to 128 answer tokens",
            ),
        ];
        for (name, value, max, allowed) in checks {
            if value == 0 || value > max {
                return Err(Error::InvalidArgument {
                    name,
                    value: value.to_string(),
                    allowed,
                });
            }
        }
        duration_s(self.think_s, false).map_err(|_| Error::InvalidArgument {
            name: "--think-s",
            value: crate::limits::show(self.think_s),
            allowed: "a finite, non-negative number of seconds",
        })?;
        Ok(())
    }

    /// The question of `turn` for `agent`.
    pub fn question(&self, agent: u32, turn: u32) -> &'static str {
        let pick = |list: &'static [&'static str], at: u32| {
            list.get(at as usize % list.len().max(1))
                .copied()
                .unwrap_or("")
        };
        if turn == 0 {
            pick(&TASKS, agent)
        } else {
            pick(&FOLLOW_UPS, agent + turn)
        }
    }
}

/// What a model run gives back.
#[derive(Debug)]
pub struct ChatRun {
    /// The engine's metrics.
    pub metrics: RunMetrics,
    /// Wall time spent verifying restores (not in the turn times).
    pub verify: Duration,
    /// Every turn's answer as the model produced it, by (session, turn).
    pub answers: BTreeMap<(u32, u32), Vec<u32>>,
}

/// The engine parameters of a model run of `policy`: `config`'s, on the model's geometry (contexts of
/// `MODEL_MAX_MODEL_LEN` tokens, at most `MODEL_MAX_RUNNING` running), the wall clock, and a threaded copy
/// engine where `config` says inline. Errors: anything `engine_params` refuses.
pub fn model_params(
    config: &EngineConfig,
    model: &LoadedModel,
    policy: Policy,
) -> Result<EngineParams> {
    let mut config = config.clone();
    config.model.max_model_len = MODEL_MAX_MODEL_LEN;
    config.scheduler.max_running = config.scheduler.max_running.min(MODEL_MAX_RUNNING);
    let mut params = config.engine_params(policy)?;
    params.geometry = model
        .geometry(MODEL_MAX_MODEL_LEN)
        .map_err(engine::Error::from)?;
    params.draft_tokens = 0;
    params.clock = ClockKind::Wall;
    if params.copy_engine == CopyEngineKind::Inline {
        params.copy_engine = CopyEngineKind::Threaded {
            workers: config.restore.copy_workers,
        };
    }
    Ok(params)
}

/// Runs the chat sessions of `spec` on `model` under `policy` until every turn has finished, with
/// `observer` shown every step and once at the end.
pub fn run_chats_live(
    config: &EngineConfig,
    spec: &ChatSpec,
    model: &Arc<LoadedModel>,
    policy: Policy,
    progress: Progress<'_>,
    observer: &mut dyn Observer<ModelExecutor>,
) -> Result<ChatRun> {
    spec.validate()?;
    let params = model_params(config, model, policy)?;
    let verify = VerifyTime::default();
    let executor = ModelExecutor::new(Arc::clone(model), verify.clone());
    let mut engine = engine_builder(config, params, executor, None)?
        .clock(Box::new(VerifyExcludedClock::new(verify.clone())))
        .build()?;
    let answers = drive_chats(&mut engine, spec, model, progress, observer)?;
    observer.finish(&engine);
    let _shutdown = engine.shutdown()?;
    Ok(ChatRun {
        metrics: engine.metrics(),
        verify: verify.total(),
        answers,
    })
}

/// Submits every session's first turn, then each next turn a think time after the previous answer.
fn drive_chats(
    engine: &mut Engine<ModelExecutor>,
    spec: &ChatSpec,
    model: &LoadedModel,
    progress: Progress<'_>,
    observer: &mut dyn Observer<ModelExecutor>,
) -> Result<BTreeMap<(u32, u32), Vec<u32>>> {
    let total = u64::from(spec.n_agents) * u64::from(spec.turns);
    let mut contexts: Vec<Vec<u32>> = vec![Vec::new(); spec.n_agents as usize];
    for (agent, context) in (0..spec.n_agents).zip(contexts.iter_mut()) {
        *context = first_prompt(model, spec, agent)?;
        submit_chat_turn(engine, spec, context, agent, 0, Timestamp::ZERO)?;
    }
    let mut answers = BTreeMap::new();
    let mut finished = 0u64;
    while !engine.is_idle() {
        let report = engine.step()?;
        observer.step(engine, &report);
        for done in engine.take_finished() {
            finished += 1;
            progress(finished, total);
            let agent = (done.id.0 / u64::from(spec.turns)) as u32;
            let turn = (done.id.0 % u64::from(spec.turns)) as u32;
            let Some(context) = contexts.get_mut(agent as usize) else {
                continue;
            };
            let next = (turn + 1 < spec.turns).then(|| spec.question(agent, turn + 1));
            extend_chat(model, context, &done.output, next)?;
            answers.insert((agent, turn), done.output);
            if next.is_some() {
                let think = duration_s(spec.think_s, false).unwrap_or(Duration::ZERO);
                let arrival = engine.now().after(think);
                submit_chat_turn(engine, spec, context, agent, turn + 1, arrival)?;
            }
        }
    }
    Ok(answers)
}

/// The first turn of session `agent`: the system prompt and its task, in the model's chat template.
/// Errors: `Model` when the tokenizer fails.
pub fn first_prompt(model: &LoadedModel, spec: &ChatSpec, agent: u32) -> Result<Vec<u32>> {
    model
        .tokenizer
        .encode_chat(&[
            llama::ChatMessage::new("system", SYSTEM_PROMPT),
            llama::ChatMessage::new("user", spec.question(agent, 0)),
        ])
        .map_err(|source| model_error(model, source))
}

/// Appends `answer` to `context` through its first end-of-turn token (closing the turn with one when the
/// answer has none), then `question` as the next user turn and the assistant's header, when given.
/// Errors: `Model` when the tokenizer fails.
pub fn extend_chat(
    model: &LoadedModel,
    context: &mut Vec<u32>,
    answer: &[u32],
    question: Option<&str>,
) -> Result<()> {
    let tokenizer = &model.tokenizer;
    match answer.iter().position(|&t| tokenizer.is_end_of_turn(t)) {
        Some(end) => context.extend(answer.iter().take(end + 1)),
        None => {
            context.extend(answer);
            context.push(tokenizer.end_of_turn());
        }
    }
    if let Some(question) = question {
        let text = format!("\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n");
        let tokens = tokenizer
            .encode_with_special(&text)
            .map_err(|source| model_error(model, source))?;
        context.extend(tokens);
    }
    Ok(())
}

fn model_error(model: &LoadedModel, source: llama::LlamaError) -> Error {
    Error::Model {
        path: model.path.clone(),
        source,
    }
}

fn submit_chat_turn(
    engine: &mut Engine<ModelExecutor>,
    spec: &ChatSpec,
    context: &[u32],
    agent: u32,
    turn: u32,
    arrival: Timestamp,
) -> Result<()> {
    let id = u64::from(agent) * u64::from(spec.turns) + u64::from(turn);
    let mut request = RequestSpec::new(id, context.to_vec(), spec.answer_tokens, arrival);
    request.is_later_turn = turn > 0;
    submit_or_reject(engine, request)
}
