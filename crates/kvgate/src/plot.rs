//! Charts of runs, policies side by side, as one SVG (`plotters`, SVG backend only: no system fonts). A
//! `Timeline` records what a run did, from the engine itself: after every step the pool's pages (in use,
//! free) and the capacity waiters of every policy (`Engine::restore_gauges`);
//! at the end every finished request's prompt tokens from cache and its turn time, the numbers the report's
//! table sums. `write_svg` draws the share of prompt tokens from cache per turn, the turn-time CDF (log time
//! axis), capacity waiters over time and pool pages over time (one panel per policy), the time series
//! averaged over spans of the run, with the legends beside the panels, not over them.

mod chart;

use std::path::{Path, PathBuf};

use engine::{Engine, Executor, StepReport};
use kv_pool::RequestId;

use crate::error::{Error, Result};
use crate::run::Observer;

/// What one policy's run did, for the charts.
pub struct Timeline {
    policy: String,
    turn_of: Box<dyn Fn(RequestId) -> u32 + Send>,
    samples: Vec<Sample>,
    turns: Vec<TurnPoint>,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("policy", &self.policy)
            .field("samples", &self.samples.len())
            .field("turns", &self.turns.len())
            .finish_non_exhaustive()
    }
}

/// The pool and the waiters after one step.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t_s: f64,
    /// Pages not free: held by running requests, by restores and by imports their consumer owns.
    used_pages: u32,
    free_pages: u32,
    capacity_waiters: u32,
}

/// One finished request.
#[derive(Clone, Copy, Debug)]
struct TurnPoint {
    turn: u32,
    prompt_tokens: u32,
    cached_tokens: u32,
    turn_s: f64,
}

impl Timeline {
    /// An empty timeline of `policy`'s run; `turn_of` gives a request's turn (or bucket) on the x axis of the
    /// cache-share chart.
    pub fn new(policy: &str, turn_of: impl Fn(RequestId) -> u32 + Send + 'static) -> Self {
        Self {
            policy: policy.to_string(),
            turn_of: Box::new(turn_of),
            samples: Vec::new(),
            turns: Vec::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Share of prompt tokens from cache (local hits and restores), in percent, per turn, in turn order.
    fn cache_share_per_turn(&self) -> Vec<(u32, f64)> {
        let mut per_turn: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        for point in &self.turns {
            let entry = per_turn.entry(point.turn).or_default();
            entry.0 += u64::from(point.cached_tokens);
            entry.1 += u64::from(point.prompt_tokens);
        }
        per_turn
            .into_iter()
            .filter(|(_, (_, prompt))| *prompt > 0)
            .map(|(turn, (cached, prompt))| (turn, 100.0 * cached as f64 / prompt as f64))
            .collect()
    }

    /// (turn time in s, fraction of turns at most that long), sorted.
    fn turn_time_cdf(&self) -> Vec<(f64, f64)> {
        let mut times: Vec<f64> = self.turns.iter().map(|p| p.turn_s).collect();
        times.sort_by(f64::total_cmp);
        let n = times.len() as f64;
        times
            .into_iter()
            .enumerate()
            .map(|(idx, t)| (t, (idx + 1) as f64 / n))
            .collect()
    }

    /// Prompt tokens from cache and prompt tokens over every finished turn: what the table's "prompt tokens
    /// from cache" divides.
    #[cfg(test)]
    pub(crate) fn cached_and_prompt_tokens(&self) -> (u64, u64) {
        self.turns.iter().fold((0, 0), |(cached, prompt), point| {
            (
                cached + u64::from(point.cached_tokens),
                prompt + u64::from(point.prompt_tokens),
            )
        })
    }

    /// Turn times (arrival to finish) of the finished requests, in seconds, in the order they finished.
    #[cfg(test)]
    pub(crate) fn turn_times_s(&self) -> Vec<f64> {
        self.turns.iter().map(|point| point.turn_s).collect()
    }

    /// The most capacity waiters after any step.
    #[cfg(test)]
    pub(crate) fn peak_capacity_waiters(&self) -> u32 {
        self.samples
            .iter()
            .map(|sample| sample.capacity_waiters)
            .max()
            .unwrap_or(0)
    }

    /// The samples averaged over `n_bins` equal spans of engine time (a span without a sample is left out),
    /// so a chart shows the trend rather than step-to-step noise.
    fn binned_samples(&self, n_bins: usize) -> Vec<Sample> {
        let t_max = self.samples.last().map_or(0.0, |s| s.t_s);
        let span = (t_max / n_bins as f64).max(f64::MIN_POSITIVE);
        let mut bins: Vec<(u32, [f64; 3])> = vec![(0, [0.0; 3]); n_bins + 1];
        for sample in &self.samples {
            let Some(bin) = bins.get_mut(((sample.t_s / span) as usize).min(n_bins)) else {
                continue;
            };
            bin.0 += 1;
            let values = [
                sample.used_pages,
                sample.free_pages,
                sample.capacity_waiters,
            ];
            for (sum, value) in bin.1.iter_mut().zip(values) {
                *sum += f64::from(value);
            }
        }
        bins.into_iter()
            .enumerate()
            .filter(|(_, (n, _))| *n > 0)
            .map(|(idx, (n, sums))| {
                let mean =
                    |i: usize| (sums.get(i).copied().unwrap_or(0.0) / f64::from(n)).round() as u32;
                Sample {
                    t_s: (idx as f64 + 0.5) * span,
                    used_pages: mean(0),
                    free_pages: mean(1),
                    capacity_waiters: mean(2),
                }
            })
            .collect()
    }
}

impl<E: Executor> Observer<E> for Timeline {
    fn step(&mut self, engine: &Engine<E>, report: &StepReport) {
        let pool = engine.pool();
        // The waiters of every policy (not only the ledger `reserved` keeps): what the report counts.
        let gauges = engine.restore_gauges();
        self.samples.push(Sample {
            t_s: report.now.as_secs_f64(),
            used_pages: pool.n_usable().saturating_sub(report.free_pages),
            free_pages: report.free_pages,
            capacity_waiters: gauges.waiters.len() as u32,
        });
    }

    fn finish(&mut self, engine: &Engine<E>) {
        self.turns = engine
            .request_metrics()
            .iter()
            .filter(|m| !m.cancelled)
            .filter_map(|m| {
                let id = m.id?;
                let finished = m.finished?;
                Some(TurnPoint {
                    turn: (self.turn_of)(id),
                    prompt_tokens: m.prompt_tokens,
                    cached_tokens: m.prompt_tokens_local_hit + m.prompt_tokens_restored,
                    turn_s: finished.as_secs_f64() - m.arrival.as_secs_f64(),
                })
            })
            .collect();
    }
}

/// Draws `timelines` (one per policy) into `<dir>/<name>.svg`, creating `dir`; `title` heads the chart and
/// `turn_label` names the cache-share chart's x axis. Returns the file written.
pub fn write_svg(
    dir: &Path,
    name: &str,
    title: &str,
    turn_label: &str,
    timelines: &[Timeline],
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Plot {
        path: dir.to_path_buf(),
        reason: source.to_string(),
    })?;
    let path = dir.join(format!("{name}.svg"));
    chart::draw(&path, title, turn_label, timelines).map_err(|reason| Error::Plot {
        path: path.clone(),
        reason,
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests;
