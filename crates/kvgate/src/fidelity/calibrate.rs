//! Fits the step-time coefficients on measured experiments (`kvgate calibrate DIR --out FILE`).
//!
//! The step model is linear in its coefficients, and so is a request's decode time (the sum of its decode
//! steps' times), so the mean time per output token of a stage is a linear function of the coefficients
//! whose terms are the simulated requests' summed step features. The fit is a fixed point: simulate with the
//! current coefficients, solve a non-negative least-squares problem on every fitted stage's mean TPOT
//! (errors relative to the measurement, a light ridge pull towards [`Coefficients::prior`] so that
//! coefficients the data cannot tell apart stay physical), simulate again with the result, [`ROUNDS`]
//! times. The first-token delay is then a second least-squares fit of each stage's mean TTFT left over.
//! Deterministic: the same measurements give the same file, whatever the thread count.
//!
//! Fits made: on every experiment that is not overloaded ([`FIT_ALL`]), and the held-out fits the report
//! needs: each workload profile left out, and separately each model left out. An experiment is reported
//! with the fits that never saw it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::experiment::Experiment;
use super::simulate::{SimRun, simulate};
use super::step_model::{
    Coefficients, CostModelFile, FIT_ALL, N_STEP, without_model, without_profile,
};
use super::{FidelityError, Result};

/// Simulate-and-solve rounds of each fit.
pub const ROUNDS: usize = 3;

/// Weight of the ridge pull towards the prior, per coefficient, against relative errors of the stages.
pub(crate) const RIDGE: f64 = 0.01;

/// Runs `simulate` on each experiment of `jobs` (experiment, fit) on every core, in order.
pub(crate) fn simulate_all(jobs: &[(&Experiment, &Coefficients)]) -> Result<Vec<SimRun>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimRun>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some((experiment, fit)) = jobs.get(index) else {
                        break;
                    };
                    let run = simulate(experiment, fit);
                    if let Ok(mut slots) = results.lock() {
                        slots[index] = Some(run);
                    }
                }
            });
        }
    });
    let slots = results.into_inner().map_err(|_| FidelityError::Invalid {
        path: "simulation".to_owned(),
        message: "a simulation thread failed; run again".to_owned(),
    })?;
    slots
        .into_iter()
        .map(|slot| {
            slot.unwrap_or_else(|| {
                Err(FidelityError::Invalid {
                    path: "simulation".to_owned(),
                    message: "a simulation did not run; run again".to_owned(),
                })
            })
        })
        .collect()
}

/// Whether `experiment` takes part in fits: none of its stages is overloaded.
pub(crate) fn fittable(experiment: &Experiment) -> bool {
    (0..experiment.stages.len()).all(|stage| !experiment.overloaded(stage))
}

/// One least-squares row: features, target, weight.
type Row = ([f64; N_STEP], f64);

/// The TPOT rows of `run` (relative: features and target over the measurement).
fn tpot_rows(experiment: &Experiment, run: &SimRun) -> Vec<Row> {
    let mut rows = Vec::new();
    for (stage, measured) in experiment.measured.iter().enumerate() {
        let measured_tpot = measured.figures[3];
        let mut sum = [0.0; N_STEP];
        let mut n = 0.0;
        for request in run.of_stage(stage) {
            let chunks = 2.0 * f64::from(request.output) + 1.0;
            for (s, f) in sum.iter_mut().zip(request.decode_features) {
                *s += f / chunks;
            }
            n += 1.0;
        }
        if n > 0.0 && measured_tpot > 0.0 {
            rows.push((sum.map(|s| s / n / measured_tpot), 1.0));
        }
    }
    rows
}

/// Solves min sum (a.x - y)^2 + ridge * sum (x_k / prior_k - 1)^2 with x >= 0 (active set: the most negative
/// coefficient is pinned at 0 and the rest solved again).
pub(crate) fn nnls_ridge<const N: usize>(
    rows: &[([f64; N], f64)],
    prior: &[f64; N],
    ridge: f64,
) -> [f64; N] {
    bounded_ridge(rows, prior, &[0.0; N], ridge)
}

/// As [`nnls_ridge`], with x_k >= `lower_k` instead of x_k >= 0 (each `lower_k` below `prior_k`).
#[allow(
    clippy::needless_range_loop,
    reason = "matrix indices read clearer than zipped iterators"
)]
pub(crate) fn bounded_ridge<const N: usize>(
    rows: &[([f64; N], f64)],
    prior: &[f64; N],
    lower: &[f64; N],
    ridge: f64,
) -> [f64; N] {
    // Unknowns u_k = (x_k - lower_k) / prior_k >= 0; the ridge pulls u_k towards 1 - lower_k / prior_k.
    let pull: [f64; N] = std::array::from_fn(|k| 1.0 - lower[k] / prior[k]);
    let mut free = [true; N];
    loop {
        let mut ata = [[0.0; N]; N];
        let mut aty = [0.0; N];
        for (a, y) in rows {
            let y = y - (0..N).map(|k| a[k] * lower[k]).sum::<f64>();
            for i in 0..N {
                let ai = a[i] * prior[i];
                aty[i] += ai * y;
                for j in 0..N {
                    ata[i][j] += ai * a[j] * prior[j];
                }
            }
        }
        for i in 0..N {
            ata[i][i] += ridge;
            aty[i] += ridge * pull[i];
        }
        for i in 0..N {
            if !free[i] {
                for j in 0..N {
                    ata[i][j] = 0.0;
                    ata[j][i] = 0.0;
                }
                ata[i][i] = 1.0;
                aty[i] = 0.0;
            }
        }
        let u = solve(ata, aty);
        let worst = (0..N)
            .filter(|&i| free[i] && u[i] < 0.0)
            .min_by(|&a, &b| u[a].total_cmp(&u[b]));
        match worst {
            Some(i) => free[i] = false,
            None => {
                return std::array::from_fn(|i| {
                    lower[i] + if free[i] { u[i] * prior[i] } else { 0.0 }
                });
            }
        }
    }
}

/// Gaussian elimination with partial pivoting; a singular system gives zeros where undetermined.
#[allow(
    clippy::needless_range_loop,
    reason = "matrix indices read clearer than zipped iterators"
)]
fn solve<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> [f64; N] {
    for col in 0..N {
        let pivot = (col..N)
            .max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        b.swap(col, pivot);
        if a[col][col].abs() < 1e-300 {
            continue;
        }
        for row in col + 1..N {
            let factor = a[row][col] / a[col][col];
            for k in col..N {
                a[row][k] -= factor * a[col][k];
            }
            b[row] -= factor * b[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        if a[row][row].abs() < 1e-300 {
            continue;
        }
        let rest: f64 = (row + 1..N).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x
}

/// Fits on `experiments`, starting from `prior` and its simulations `first` (one per experiment).
fn fit(
    experiments: &[&Experiment],
    prior: &Coefficients,
    first: Vec<SimRun>,
) -> Result<Coefficients> {
    let mut coefficients = prior.clone();
    let mut runs = first;
    for round in 0..ROUNDS {
        let rows: Vec<Row> = experiments
            .iter()
            .zip(&runs)
            .flat_map(|(e, run)| tpot_rows(e, run))
            .collect();
        coefficients = coefficients.with_step(bounded_ridge(
            &rows,
            &prior.step(),
            &Coefficients::LOWER,
            RIDGE,
        ));
        let _ = round;
        let jobs: Vec<(&Experiment, &Coefficients)> =
            experiments.iter().map(|e| (*e, &coefficients)).collect();
        runs = simulate_all(&jobs)?;
    }
    // The first-token delay: measured mean TTFT - simulated = first_token_s + first_token_steps * step.
    let mut rows: Vec<([f64; 2], f64)> = Vec::new();
    for (experiment, run) in experiments.iter().zip(&runs) {
        for (stage, measured) in experiment.measured.iter().enumerate() {
            let of: Vec<_> = run.of_stage(stage).collect();
            if of.is_empty() || measured.figures[0] <= 0.0 {
                continue;
            }
            let n = of.len() as f64;
            let ttft = of.iter().map(|r| r.ttft_s).sum::<f64>() / n;
            let step = of.iter().map(|r| r.step_s()).sum::<f64>() / n;
            let scale = measured.figures[0];
            rows.push((
                [1.0 / scale, step / scale],
                (measured.figures[0] - ttft) / scale,
            ));
        }
    }
    let [first_token_s, first_token_steps] = nnls_ridge(
        &rows,
        &[prior.first_token_s, prior.first_token_steps],
        RIDGE,
    );
    Ok(Coefficients {
        first_token_s,
        first_token_steps,
        fitted_on: experiments.iter().map(|e| e.name.clone()).collect(),
        ..coefficients
    })
}

/// Every fit the report uses, on `experiments`: all, each profile left out, each model left out. Overloaded
/// experiments take part in none.
pub fn calibrate(experiments: &[Experiment], fitted_by: &str) -> Result<CostModelFile> {
    let usable: Vec<&Experiment> = experiments.iter().filter(|e| fittable(e)).collect();
    if usable.is_empty() {
        return Err(FidelityError::Invalid {
            path: "experiments".to_owned(),
            message: "every experiment is overloaded; give measurements of a server that kept up"
                .to_owned(),
        });
    }
    let prior = Coefficients::prior();
    let jobs: Vec<(&Experiment, &Coefficients)> = usable.iter().map(|e| (*e, &prior)).collect();
    let first = simulate_all(&jobs)?;
    let mut subsets: Vec<(String, Vec<usize>)> =
        vec![(FIT_ALL.to_owned(), (0..usable.len()).collect())];
    let mut profiles: Vec<&str> = experiments.iter().map(|e| e.profile.as_str()).collect();
    profiles.sort_unstable();
    profiles.dedup();
    let mut models: Vec<&str> = experiments.iter().map(|e| e.model_key.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    for profile in &profiles {
        subsets.push((
            without_profile(profile),
            (0..usable.len())
                .filter(|&i| usable[i].profile != *profile)
                .collect(),
        ));
    }
    for model in &models {
        subsets.push((
            without_model(model),
            (0..usable.len())
                .filter(|&i| usable[i].model_key != *model)
                .collect(),
        ));
    }
    let mut fits = BTreeMap::new();
    for (name, members) in subsets {
        if members.is_empty() {
            continue;
        }
        let chosen: Vec<&Experiment> = members.iter().map(|&i| usable[i]).collect();
        let runs: Vec<SimRun> = members.iter().map(|&i| first[i].clone()).collect();
        fits.insert(name, fit(&chosen, &prior, runs)?);
    }
    Ok(CostModelFile {
        fitted_by: fitted_by.to_owned(),
        fits,
    })
}
