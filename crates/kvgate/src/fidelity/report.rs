//! Predicted against measured, per experiment and stage: the nine figures, their absolute percentage errors
//! under the fit on everything (in sample) and under the fits that never saw the experiment (its profile
//! left out; its model left out), and the medians, overloaded stages apart (`kvgate fidelity DIR`).

use std::fmt::Write as _;

use serde::Serialize;

use super::calibrate::simulate_all;
use super::experiment::{Experiment, FIGURES, Figures};
use super::step_model::{Coefficients, CostModelFile, FIT_ALL, without_model, without_profile};
use super::{FidelityError, Result};

/// One figure of one stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct FigureRow {
    /// `ttft.mean` and so on.
    pub figure: String,
    /// Measured, seconds.
    pub measured: f64,
    /// Predicted by the fit on every experiment, seconds.
    pub fitted: f64,
    /// Predicted by the fit that left the experiment's profile out, seconds.
    pub held_out_profile: f64,
    /// Predicted by the fit that left the experiment's model out, seconds.
    pub held_out_model: f64,
}

/// Absolute percentage error of `predicted` against `measured`.
pub(crate) fn ape(predicted: f64, measured: f64) -> f64 {
    ((predicted - measured) / measured).abs() * 100.0
}

/// One stage of one experiment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct StageRow {
    /// The experiment's folder name.
    pub experiment: String,
    /// Stage index.
    pub stage: usize,
    /// Requests per second.
    pub rate: f64,
    /// Whether the stage ran overloaded (more than 10% of requests failed).
    pub overloaded: bool,
    /// Whether the fit on every experiment saw this stage.
    pub in_fit: bool,
    /// The nine figures.
    pub figures: Vec<FigureRow>,
}

/// The whole comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    /// Every stage.
    pub stages: Vec<StageRow>,
    /// Median APE of the in-sample figures (fit on everything), stages not overloaded.
    pub fitted_median_ape_pct: f64,
    /// Median APE of the held-out figures (both leave-outs pooled), stages not overloaded.
    pub held_out_median_ape_pct: f64,
    /// Median APE with each experiment's profile left out, stages not overloaded.
    pub held_out_profile_median_ape_pct: f64,
    /// Median APE with each experiment's model left out, stages not overloaded.
    pub held_out_model_median_ape_pct: f64,
    /// Largest held-out APE outside overloaded stages.
    pub held_out_worst_ape_pct: f64,
    /// Held-out figures above 25% outside overloaded stages.
    pub held_out_figures_over_25_pct: usize,
    /// Held-out figures outside overloaded stages.
    pub held_out_figures: usize,
    /// Median held-out APE over the overloaded stages.
    pub overload_held_out_median_ape_pct: f64,
    /// The overloaded experiments.
    pub overloaded_experiments: Vec<String>,
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Simulates every experiment under its three fits and compares.
pub(crate) fn compare(experiments: &[Experiment], file: &CostModelFile) -> Result<Report> {
    let all = file
        .fits
        .get(FIT_ALL)
        .ok_or_else(|| FidelityError::CostModel {
            path: "cost model".to_owned(),
            field: format!("fits.{FIT_ALL}"),
            message: "is missing; run `kvgate calibrate`".to_owned(),
        })?;
    let fits_of = |e: &Experiment| -> [&Coefficients; 3] {
        [
            all,
            file.fit_or_all(&without_profile(&e.profile)).unwrap_or(all),
            file.fit_or_all(&without_model(&e.model_key)).unwrap_or(all),
        ]
    };
    let mut jobs = Vec::new();
    for experiment in experiments {
        for fit in fits_of(experiment) {
            jobs.push((experiment, fit));
        }
    }
    let runs = simulate_all(&jobs)?;
    let mut stages = Vec::new();
    for (index, experiment) in experiments.iter().enumerate() {
        let fits = fits_of(experiment);
        let predicted: Vec<Vec<Figures>> = (0..3)
            .map(|k| runs[3 * index + k].figures(fits[k]))
            .collect::<Result<_>>()?;
        for (stage, measured) in experiment.measured.iter().enumerate() {
            let figures = FIGURES
                .iter()
                .enumerate()
                .map(|(f, (metric, stat))| FigureRow {
                    figure: format!("{}.{}", metric.name(), stat.name()),
                    measured: measured.figures[f],
                    fitted: predicted[0][stage][f],
                    held_out_profile: predicted[1][stage][f],
                    held_out_model: predicted[2][stage][f],
                })
                .collect();
            stages.push(StageRow {
                experiment: experiment.name.clone(),
                stage,
                rate: experiment.stages[stage].rate,
                overloaded: experiment.overloaded(stage),
                in_fit: all.fitted_on.contains(&experiment.name),
                figures,
            });
        }
    }
    Ok(summarize(stages, experiments))
}

fn summarize(stages: Vec<StageRow>, experiments: &[Experiment]) -> Report {
    let normal = || {
        stages
            .iter()
            .filter(|s| !s.overloaded)
            .flat_map(|s| &s.figures)
    };
    let fitted: Vec<f64> = stages
        .iter()
        .filter(|s| !s.overloaded && s.in_fit)
        .flat_map(|s| &s.figures)
        .map(|f| ape(f.fitted, f.measured))
        .collect();
    let profile: Vec<f64> = normal()
        .map(|f| ape(f.held_out_profile, f.measured))
        .collect();
    let model: Vec<f64> = normal()
        .map(|f| ape(f.held_out_model, f.measured))
        .collect();
    let pooled: Vec<f64> = profile.iter().chain(&model).copied().collect();
    let overload: Vec<f64> = stages
        .iter()
        .filter(|s| s.overloaded)
        .flat_map(|s| &s.figures)
        .flat_map(|f| {
            [
                ape(f.held_out_profile, f.measured),
                ape(f.held_out_model, f.measured),
            ]
        })
        .collect();
    let mut overloaded_experiments: Vec<String> = experiments
        .iter()
        .filter(|e| (0..e.stages.len()).any(|s| e.overloaded(s)))
        .map(|e| e.name.clone())
        .collect();
    overloaded_experiments.sort();
    Report {
        fitted_median_ape_pct: median(fitted),
        held_out_median_ape_pct: median(pooled.clone()),
        held_out_profile_median_ape_pct: median(profile),
        held_out_model_median_ape_pct: median(model),
        held_out_worst_ape_pct: pooled.iter().copied().fold(0.0, f64::max),
        held_out_figures_over_25_pct: pooled.iter().filter(|&&a| a > 25.0).count(),
        held_out_figures: pooled.len(),
        overload_held_out_median_ape_pct: median(overload),
        overloaded_experiments,
        stages,
    }
}

/// A figure in milliseconds, three significant places.
fn ms(seconds: f64) -> String {
    let value = seconds * 1000.0;
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

impl Report {
    /// The report as a table.
    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Predicted against measured (milliseconds; APE = absolute percentage error). \"fitted\": the fit on every\n\
             experiment that kept up (in sample); \"-profile\" / \"-model\": the fits that left the experiment's\n\
             workload profile / model out (held out).\n"
        );
        let _ = writeln!(
            out,
            "{:<44} {:>2} {:>5} {:<9} {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6}",
            "experiment",
            "st",
            "rps",
            "figure",
            "measured",
            "fitted",
            "APE%",
            "-profile",
            "APE%",
            "-model",
            "APE%"
        );
        let mut overload_rows = String::new();
        for stage in &self.stages {
            let target = if stage.overloaded {
                &mut overload_rows
            } else {
                &mut out
            };
            for f in &stage.figures {
                let _ = writeln!(
                    target,
                    "{:<44} {:>2} {:>5} {:<9} {:>9} {:>9} {:>6.1} {:>9} {:>6.1} {:>9} {:>6.1}",
                    stage.experiment,
                    stage.stage,
                    stage.rate,
                    f.figure,
                    ms(f.measured),
                    ms(f.fitted),
                    ape(f.fitted, f.measured),
                    ms(f.held_out_profile),
                    ape(f.held_out_profile, f.measured),
                    ms(f.held_out_model),
                    ape(f.held_out_model, f.measured),
                );
            }
        }
        let _ = writeln!(
            out,
            "\nOverloaded stages (more than 10% of requests failed; measured latencies cover only the requests that\n\
             got through), apart: {}\n{overload_rows}",
            self.overloaded_experiments.join(", ")
        );
        let _ = writeln!(
            out,
            "Median APE over the nine figures, stages not overloaded:\n\
             \x20 fitted (in sample)           {:>6.1}%\n\
             \x20 held out, profile left out   {:>6.1}%\n\
             \x20 held out, model left out     {:>6.1}%\n\
             \x20 held out, both               {:>6.1}%   worst {:.1}%, {} of {} figures above 25%\n\
             Overloaded stages, held out     {:>6.1}%",
            self.fitted_median_ape_pct,
            self.held_out_profile_median_ape_pct,
            self.held_out_model_median_ape_pct,
            self.held_out_median_ape_pct,
            self.held_out_worst_ape_pct,
            self.held_out_figures_over_25_pct,
            self.held_out_figures,
            self.overload_held_out_median_ape_pct,
        );
        out
    }

    /// The report as JSON.
    pub(crate) fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A cost preset's own figures (no calibration, no first-token delay) against the experiments whose server
/// is the kind the preset stands for ([`super::target::shape_of`]: the same tensor parallelism and a dense or
/// mixture-of-experts model alike), stages not overloaded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PresetReport {
    /// The cost preset.
    pub preset: String,
    /// The experiments it was run on.
    pub experiments: Vec<String>,
    /// Every figure of every stage not overloaded: (experiment, stage, figure, measured, predicted).
    pub figures: Vec<(String, usize, String, f64, f64)>,
    /// Median APE over them.
    pub median_ape_pct: f64,
    /// Figures above 25%.
    pub figures_over_25_pct: usize,
}

/// The kind of server cost preset `name` stands for: its tensor parallelism, whether its model is a mixture
/// of experts, and its cost model. Errors: a preset with no calibrated shape.
pub(crate) fn preset_kind(name: &str) -> Result<(u32, bool, engine::CostModel)> {
    match (
        super::target::shape_of(name),
        engine::CostModel::preset(name),
    ) {
        (Some((shape, _, tp)), Some(cost)) => Ok((tp, shape.experts > 1, cost)),
        _ => Err(FidelityError::Invalid {
            path: format!("--preset {name}"),
            message: "has no calibrated shape to match experiments against; allowed: small-8b-gpu"
                .to_owned(),
        }),
    }
}

/// Runs cost preset `name` on the experiments of its kind. Errors: a preset with no calibrated shape, or
/// no experiment of its kind in `experiments`.
pub(crate) fn preset_check(experiments: &[Experiment], name: &str) -> Result<PresetReport> {
    let (tp, moe, cost) = preset_kind(name)?;
    let chosen: Vec<&Experiment> = experiments
        .iter()
        .filter(|e| e.server.tensor_parallel == tp && (e.model.experts > 1) == moe)
        .collect();
    if chosen.is_empty() {
        return Err(FidelityError::Invalid {
            path: format!("--preset {name}"),
            message: format!(
                "no experiment runs the kind of server it stands for (tensor parallel {tp}, {})",
                if moe { "mixture of experts" } else { "dense" }
            ),
        });
    }
    let no_delay = Coefficients {
        first_token_s: 0.0,
        first_token_steps: 0.0,
        ..Coefficients::prior()
    };
    let mut figures = Vec::new();
    for experiment in &chosen {
        let run = super::simulate::simulate_priced(experiment, cost.clone())?;
        let predicted = run.figures(&no_delay)?;
        for (stage, measured) in experiment.measured.iter().enumerate() {
            if experiment.overloaded(stage) {
                continue;
            }
            for (f, (metric, stat)) in FIGURES.iter().enumerate() {
                figures.push((
                    experiment.name.clone(),
                    stage,
                    format!("{}.{}", metric.name(), stat.name()),
                    measured.figures[f],
                    predicted[stage][f],
                ));
            }
        }
    }
    let apes: Vec<f64> = figures.iter().map(|f| ape(f.4, f.3)).collect();
    Ok(PresetReport {
        preset: name.to_owned(),
        experiments: chosen.iter().map(|e| e.name.clone()).collect(),
        figures_over_25_pct: apes.iter().filter(|&&a| a > 25.0).count(),
        median_ape_pct: median(apes),
        figures,
    })
}

impl PresetReport {
    /// The report as a table.
    pub(crate) fn table(&self) -> String {
        let mut out = format!(
            "Cost preset {} (its own step figures, no first-token delay) against the measurements \
             (milliseconds), stages not overloaded\n\n{:<44} {:>2} {:<9} {:>9} {:>9} {:>6}\n",
            self.preset, "experiment", "st", "figure", "measured", "preset", "APE%"
        );
        for (experiment, stage, figure, measured, predicted) in &self.figures {
            let _ = writeln!(
                out,
                "{experiment:<44} {stage:>2} {figure:<9} {:>9} {:>9} {:>6.1}",
                ms(*measured),
                ms(*predicted),
                ape(*predicted, *measured)
            );
        }
        let _ = writeln!(
            out,
            "\nMedian APE {:.1}%, {} of {} figures above 25%",
            self.median_ape_pct,
            self.figures_over_25_pct,
            self.figures.len()
        );
        out
    }

    /// The report as JSON.
    pub(crate) fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
