//! The `kvgate fidelity DIR` and `kvgate calibrate DIR --out FILE` subcommands: their options and entry
//! points, which return what the binary prints.

use std::path::PathBuf;

use clap::Args;

use super::Result;
use super::calibrate::calibrate;
use super::experiment::load_all;
use super::report::{compare, preset_check, preset_kind};
use super::step_model::CostModelFile;

/// `kvgate fidelity DIR`.
#[derive(Debug, Args)]
pub struct FidelityArgs {
    /// The measurements: the folder holding experiments/, models/ and hardware/ (as ../shared/fidelity).
    pub dir: PathBuf,
    /// Step-time coefficients (TOML, as `kvgate calibrate` writes). Default: the committed H100 fit.
    #[arg(long, value_name = "FILE")]
    pub cost_model: Option<PathBuf>,
    /// Instead of a fit: run this cost preset's own step figures (small-8b-gpu) on the experiments of the
    /// kind of server it stands for (dense, one GPU: Llama-2-7B) and print its error.
    #[arg(long, value_name = "NAME", conflicts_with = "cost_model")]
    pub preset: Option<String>,
    /// Print JSON (with `held_out_median_ape_pct` and `fitted_median_ape_pct`) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `kvgate calibrate DIR --out FILE`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The measurements, as for `fidelity`.
    pub dir: PathBuf,
    /// Where to write the coefficients (TOML).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Runs `kvgate fidelity`; returns what to print. The coefficient file is checked before the measurements
/// are read.
pub fn fidelity(args: &FidelityArgs) -> Result<String> {
    if let Some(preset) = &args.preset {
        preset_kind(preset)?;
        let report = preset_check(&load_all(&args.dir)?, preset)?;
        return Ok(if args.json {
            report.json()
        } else {
            report.table()
        });
    }
    let file = match &args.cost_model {
        Some(path) => CostModelFile::load(path)?,
        None => CostModelFile::committed()?,
    };
    let experiments = load_all(&args.dir)?;
    let report = compare(&experiments, &file)?;
    Ok(if args.json {
        report.json()
    } else {
        report.table()
    })
}

/// Runs `kvgate calibrate`; writes the file and returns a line saying so.
pub fn calibrate_to_file(args: &CalibrateArgs) -> Result<String> {
    let experiments = load_all(&args.dir)?;
    let fitted_by = format!(
        "kvgate calibrate {} --out {}",
        args.dir.display(),
        args.out.display()
    );
    let file = calibrate(&experiments, &fitted_by)?;
    let text = format!(
        "# Step-time coefficients of vLLM on H100 SXM, fitted by `{fitted_by}`\n\
         # (crates/kvgate/src/fidelity/step_model.rs says what each means). Rerun that command to refit.\n{}",
        file.to_toml()
    );
    std::fs::write(&args.out, text).map_err(|source| super::FidelityError::Read {
        path: args.out.display().to_string(),
        source,
    })?;
    Ok(format!(
        "wrote {} fits to {}",
        file.fits.len(),
        args.out.display()
    ))
}
