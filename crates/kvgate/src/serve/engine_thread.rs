//! The engine's own thread: it owns the `Engine` (on the wall clock), takes requests from a bounded channel
//! and cancels and the drain order from an unbounded one, steps, and streams each request's new output
//! tokens back on its own channel. With the simulated executor every step lasts its modeled duration in
//! real time, so latencies look like the modeled GPU's.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender};
use engine::{Engine, Executor, RejectReason, RequestSpec};
use kv_pool::RequestId;
use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::latency::ServeMetrics;
use crate::error::Result;
use crate::model::{Sampling, SamplingTable};
use crate::prometheus::EngineMetrics;
use crate::run::Observer;

/// Longest an idle engine thread sleeps before it looks at its channels again.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// Longest a paced step sleeps (a modeled step of more is cut short).
const PACE_MAX: Duration = Duration::from_secs(1);

/// A request for the engine.
#[derive(Debug)]
pub(crate) struct Submission {
    /// Its id, unique among live requests.
    pub id: RequestId,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output cap.
    pub max_tokens: u32,
    /// Whether the prompt continues a conversation (a chat with an assistant message).
    pub is_later_turn: bool,
    /// When the server received it.
    pub received: Instant,
    /// How its tokens are picked (the model executor; the others' tokens are their own).
    pub sampling: Sampling,
    /// Where its tokens go.
    pub events: UnboundedSender<Event>,
}

/// What the engine thread is told besides requests.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Control {
    /// Cancel a request (its client went away).
    Cancel(RequestId),
    /// A request's text reached a stop sequence at its `tokens`-th output token: end it there. It counts as
    /// finished with those tokens, in `/metrics` as in its `usage`, whatever the engine made after them.
    Stop {
        /// The request.
        request: RequestId,
        /// Output tokens through the one that completed the stop sequence.
        tokens: u32,
    },
    /// Take no more requests; finish what runs within `grace`, cancel the rest, drain copies, stop.
    Drain {
        /// How long running requests may take to finish.
        grace: Duration,
    },
}

/// What a request's channel carries.
#[derive(Debug)]
pub(crate) enum Event {
    /// New output tokens.
    Tokens(Vec<u32>),
    /// The request ended.
    Finished(Outcome),
    /// The request failed.
    Failed(ApiError),
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens that came from the prefix cache or a restore, never computed.
    pub cached_tokens: u32,
    /// Output tokens the engine produced.
    pub output_tokens: u32,
    /// Whether it was cancelled.
    pub cancelled: bool,
}

/// What the engine thread did by the time it stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Requests cancelled at shutdown because they did not finish within the grace time.
    pub cancelled: usize,
    /// Copies in flight at shutdown that were waited for.
    pub copies_drained: usize,
    /// Pages no owner accounts for after shutdown (0 unless there is a bug).
    pub leaked_pages: u32,
}

/// Makes the engine (again, after an engine error).
pub(crate) type EngineFactory<E> = Box<dyn FnMut() -> Result<Engine<E>> + Send>;

/// A request the engine is working on.
#[derive(Debug)]
struct Live {
    events: UnboundedSender<Event>,
    sent: usize,
    received: Instant,
    first_token: Option<Instant>,
    /// Output tokens through the model's end-of-turn token, once it came.
    ended_at: Option<usize>,
    /// Output tokens through the end of a stop sequence, once the handler saw one (`Control::Stop`).
    stopped_at: Option<usize>,
}

/// The engine thread's state.
pub(crate) struct EngineLoop<E: Executor> {
    engine: Engine<E>,
    factory: EngineFactory<E>,
    live: HashMap<RequestId, Live>,
    engine_metrics: EngineMetrics,
    metrics: ServeMetrics,
    pace: bool,
    copy_delay: Duration,
    drain_deadline: Option<Instant>,
    sampling: Option<SamplingTable>,
    end_of_turn: Option<u32>,
}

impl<E: Executor> std::fmt::Debug for EngineLoop<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLoop")
            .field("live", &self.live.len())
            .field("pace", &self.pace)
            .finish_non_exhaustive()
    }
}

impl<E: Executor> EngineLoop<E> {
    /// A loop around the engine `factory` makes. `pace`: sleep each step's modeled duration (the simulated
    /// executor). `copy_delay`: every restore copy completes this much later (fault tests; zero normally).
    pub(crate) fn new(
        mut factory: EngineFactory<E>,
        engine_metrics: EngineMetrics,
        metrics: ServeMetrics,
        pace: bool,
        copy_delay: Duration,
    ) -> Result<EngineLoop<E>> {
        let engine = factory()?;
        Ok(EngineLoop {
            engine,
            factory,
            live: HashMap::new(),
            engine_metrics,
            metrics,
            pace,
            copy_delay,
            drain_deadline: None,
            sampling: None,
            end_of_turn: None,
        })
    }

    /// This loop around a real model: each request's sampling goes into `sampling` (which the model's
    /// executor reads), and an answer's text ends at `end_of_turn` (the engine, built with it as its
    /// `stop_token`, ends the answer there and leaves its response checkpoint).
    #[must_use]
    pub(crate) fn for_model(mut self, sampling: SamplingTable, end_of_turn: u32) -> EngineLoop<E> {
        self.sampling = Some(sampling);
        self.end_of_turn = Some(end_of_turn);
        self
    }

    /// The length of `output` through its first end-of-turn token, if it has one.
    fn end_of_turn_in(&self, output: &[u32]) -> Option<usize> {
        let end = self.end_of_turn?;
        output.iter().position(|&t| t == end).map(|at| at + 1)
    }

    fn forget(&self, request: RequestId) {
        if let Some(sampling) = &self.sampling {
            sampling.remove(request);
        }
    }

    /// Runs until drained: steps while there is work, waits on the channels when there is none.
    pub(crate) fn run(
        mut self,
        submissions: &Receiver<Submission>,
        control: &Receiver<Control>,
    ) -> DrainReport {
        loop {
            self.take_control(control);
            if self.drain_deadline.is_some() {
                while let Ok(submission) = submissions.try_recv() {
                    refuse_draining(&submission);
                }
                if self.live.is_empty()
                    || self.drain_deadline.is_some_and(|at| Instant::now() >= at)
                {
                    return self.shut_down();
                }
            } else {
                while let Ok(submission) = submissions.try_recv() {
                    self.submit(submission);
                }
            }
            if self.live.is_empty() && self.engine.is_idle() {
                crossbeam::channel::select! {
                    recv(submissions) -> submission => if let Ok(submission) = submission {
                        if self.drain_deadline.is_some() {
                            refuse_draining(&submission);
                        } else {
                            self.submit(submission);
                        }
                    },
                    recv(control) -> command => if let Ok(command) = command {
                        self.obey(command);
                    },
                    default(IDLE_POLL) => {},
                }
                continue;
            }
            self.step();
        }
    }

    fn take_control(&mut self, control: &Receiver<Control>) {
        loop {
            match control.try_recv() {
                Ok(command) => self.obey(command),
                Err(_) => return,
            }
        }
    }

    fn obey(&mut self, command: Control) {
        match command {
            Control::Cancel(id) => {
                if self.live.contains_key(&id) {
                    // An id that already finished is no error: the cancel crossed its last token.
                    let _ = self.engine.cancel(id);
                }
            }
            Control::Stop { request, tokens } => {
                if let Some(live) = self.live.get_mut(&request) {
                    live.stopped_at = Some(tokens as usize);
                    let _ = self.engine.cancel(request);
                }
            }
            Control::Drain { grace } => {
                self.drain_deadline.get_or_insert(Instant::now() + grace);
            }
        }
    }

    fn submit(&mut self, submission: Submission) {
        let mut spec = RequestSpec::new(
            submission.id.0,
            submission.prompt,
            submission.max_tokens,
            self.engine.now(),
        );
        spec.is_later_turn = submission.is_later_turn;
        if !self.copy_delay.is_zero() {
            let _ = self.engine.inject_copy_fault(crate::Fault::DelayNext {
                rank: 0,
                by: self.copy_delay,
            });
        }
        if let Some(sampling) = &self.sampling {
            sampling.set(submission.id, submission.sampling);
        }
        match self.engine.submit(spec) {
            Ok(()) => {
                self.live.insert(
                    submission.id,
                    Live {
                        events: submission.events,
                        sent: 0,
                        received: submission.received,
                        first_token: None,
                        ended_at: None,
                        stopped_at: None,
                    },
                );
            }
            Err(error) => {
                self.forget(submission.id);
                let _ = submission.events.send(Event::Failed(ApiError::invalid(
                    "prompt",
                    format!("the engine refused the request: {error}"),
                )));
            }
        }
    }

    /// One engine step, then the new tokens and the finished requests to their channels.
    fn step(&mut self) {
        let report = match self.engine.step() {
            Ok(report) => report,
            Err(error) => return self.recover(&error),
        };
        self.engine_metrics.step(&self.engine, &report);
        if self.pace && report.scheduled_any() {
            std::thread::sleep(report.duration.min(PACE_MAX));
        }
        let now = Instant::now();
        let mut gone = Vec::new();
        for (id, live) in &mut self.live {
            if live.ended_at.is_some() {
                continue;
            }
            let Some(output) = self.engine.output_tokens(*id) else {
                continue;
            };
            let ended_at = self
                .end_of_turn
                .and_then(|end| output.iter().position(|&t| t == end))
                .map(|at| at + 1);
            let output = output
                .get(..ended_at.unwrap_or(output.len()))
                .unwrap_or(output);
            // The engine ended the answer there itself (`EngineParams::stop_token`): it finishes this step.
            live.ended_at = ended_at;
            if output.len() > live.sent {
                if live.first_token.is_none() {
                    live.first_token = Some(now);
                    self.metrics.observe_first_token(now - live.received);
                }
                let tokens = output.get(live.sent..).unwrap_or_default().to_vec();
                live.sent = output.len();
                if live.events.send(Event::Tokens(tokens)).is_err() {
                    gone.push(*id);
                }
            }
        }
        for id in gone {
            let _ = self.engine.cancel(id);
        }
        self.finish(now);
    }

    /// Hands finished and cancelled requests their last tokens and their outcome.
    fn finish(&mut self, now: Instant) {
        for finished in self.engine.take_finished() {
            let Some(live) = self.live.remove(&finished.id) else {
                continue;
            };
            self.forget(finished.id);
            if let Some(reason) = finished.metrics.rejected {
                self.metrics.count_request("rejected");
                let _ = live.events.send(Event::Failed(rejected(reason)));
                continue;
            }
            let ended_at = live
                .ended_at
                .or_else(|| self.end_of_turn_in(&finished.output))
                .into_iter()
                .chain(live.stopped_at)
                .min();
            let output = finished
                .output
                .get(..ended_at.unwrap_or(finished.output.len()))
                .unwrap_or(&finished.output);
            if let Some(rest) = output.get(live.sent..)
                && !rest.is_empty()
            {
                let _ = live.events.send(Event::Tokens(rest.to_vec()));
            }
            // Ended at a stop sequence: a finished answer, cancelled in the engine only to stop it.
            let cancelled = finished.cancelled && live.stopped_at.is_none();
            let metrics = &finished.metrics;
            let n_output = output.len() as u32;
            let first = live.first_token.unwrap_or(now);
            if live.first_token.is_none() && n_output > 0 {
                self.metrics.observe_first_token(first - live.received);
            }
            self.metrics
                .observe_finished(now - live.received, now - first, n_output, cancelled);
            let _ = live.events.send(Event::Finished(Outcome {
                prompt_tokens: metrics.prompt_tokens,
                cached_tokens: metrics.prompt_tokens_local_hit + metrics.prompt_tokens_restored,
                output_tokens: n_output,
                cancelled,
            }));
        }
    }

    /// After an engine error: every live request fails with a 500, and a new engine takes over.
    fn recover(&mut self, error: &engine::Error) {
        tracing::error!(
            "engine error, failing {} request(s) and restarting the engine: {error}",
            self.live.len()
        );
        for (id, live) in self.live.drain() {
            if let Some(sampling) = &self.sampling {
                sampling.remove(id);
            }
            self.metrics.count_request("failed");
            let _ = live.events.send(Event::Failed(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the engine failed: {error}"),
            )));
        }
        let _ = self.engine.shutdown();
        match (self.factory)() {
            Ok(engine) => self.engine = engine,
            Err(error) => {
                tracing::error!("cannot restart the engine: {error}; stopping");
                self.drain_deadline = Some(Instant::now());
            }
        }
    }

    /// Cancels what still runs, waits for copies in flight, and reports.
    fn shut_down(mut self) -> DrainReport {
        let (cancelled, copies_drained) = match self.engine.shutdown() {
            Ok(report) => (report.cancelled.len(), report.copies_drained),
            Err(error) => {
                tracing::error!("engine shutdown failed: {error}");
                (0, 0)
            }
        };
        self.finish(Instant::now());
        for (id, live) in self.live.drain() {
            if let Some(sampling) = &self.sampling {
                sampling.remove(id);
            }
            let _ = live.events.send(Event::Failed(draining()));
        }
        DrainReport {
            cancelled,
            copies_drained,
            leaked_pages: self.engine.leaked_pages(),
        }
    }
}

fn draining() -> ApiError {
    ApiError::status(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down; try another replica",
    )
}

fn refuse_draining(submission: &Submission) {
    let _ = submission.events.send(Event::Failed(draining()));
}

fn rejected(reason: RejectReason) -> ApiError {
    match reason {
        RejectReason::LongerThanModel => ApiError::invalid(
            "messages",
            "the prompt and its max_tokens are longer than the model's context",
        )
        .with_code("context_length_exceeded"),
        RejectReason::LargerThanPool => ApiError::invalid(
            "messages",
            "the prompt and its max_tokens need more KV pages than the whole pool holds; send a shorter \
             prompt or a smaller max_tokens",
        )
        .with_code("context_length_exceeded"),
    }
}

/// Starts the engine thread; returns once the engine is built (or failed to build).
pub(crate) fn spawn<E: Executor + 'static>(
    make: impl FnOnce() -> Result<EngineLoop<E>> + Send + 'static,
    submissions: Receiver<Submission>,
    control: Receiver<Control>,
) -> Result<std::thread::JoinHandle<DrainReport>> {
    let (ready_tx, ready_rx): (Sender<Result<()>>, _) = crossbeam::channel::bounded(1);
    let thread = std::thread::Builder::new()
        .name("kvgate-engine".into())
        .spawn(move || match make() {
            Ok(engine_loop) => {
                let _ = ready_tx.send(Ok(()));
                engine_loop.run(&submissions, &control)
            }
            Err(error) => {
                let _ = ready_tx.send(Err(error));
                DrainReport::default()
            }
        })
        .map_err(|e| crate::Error::Serve(format!("cannot start the engine thread: {e}")))?;
    match ready_rx.recv_timeout(Duration::from_secs(600)) {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(error)) => Err(error),
        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Err(
            crate::Error::Serve("the engine thread did not start".into()),
        ),
    }
}
