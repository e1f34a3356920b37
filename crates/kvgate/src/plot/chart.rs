//! Drawing: the four charts of `Timeline`s on one SVG page. Under the title, one legend of the policies'
//! colours (the same in every panel, so no panel carries a legend over its data). Top: cache share per turn
//! and the turn-time CDF on a log time axis (a long tail does not squash the rest); middle: capacity waiters
//! over time; bottom: pool pages over time, one panel per policy, under a legend of their two lines.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::Timeline;

const WIDTH: u32 = 1500;
const HEIGHT: u32 = 1300;

/// Spans of engine time the capacity waiters are averaged over.
const WAITER_BINS: usize = 200;

/// Spans of engine time a pool panel (a quarter of the width) is averaged over.
const POOL_BINS: usize = 80;

/// Height of a legend strip, in pixels.
const LEGEND_HEIGHT: u32 = 34;

/// Colour of each policy by name (others: grey).
pub(crate) fn policy_colour(policy: &str) -> RGBColor {
    match policy {
        "ordinary" => RGBColor(0xd6, 0x27, 0x28),
        "pages-only" => RGBColor(0xff, 0x7f, 0x0e),
        "reserved" => RGBColor(0x1f, 0x77, 0xb4),
        "oracle" => RGBColor(0x2c, 0xa0, 0x2c),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// How `policy`'s line is drawn: the unbounded-pool `oracle` as a wide translucent band, so that a policy
/// reaching the same figures (`reserved`) stays visible inside it instead of hidden under it.
fn policy_style(policy: &str) -> ShapeStyle {
    let colour = policy_colour(policy);
    if policy == "oracle" {
        colour.mix(0.35).stroke_width(8)
    } else {
        colour.stroke_width(2)
    }
}

/// A line of a pool panel: its label, colour and value per sample.
type PoolLine = (&'static str, RGBColor, fn(&super::Sample) -> f64);

/// The lines of a pool panel.
const POOL_LINES: [PoolLine; 2] = [
    (
        "pool pages in use (running requests, restores and their imports)",
        RGBColor(0x44, 0x44, 0x44),
        |s| f64::from(s.used_pages),
    ),
    (
        "pool pages free (empty or cached)",
        RGBColor(0x17, 0xbe, 0xcf),
        |s| f64::from(s.free_pages),
    ),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Writes the chart of `timelines` to `path`; the reason otherwise.
pub(super) fn draw(
    path: &Path,
    title: &str,
    turn_label: &str,
    timelines: &[Timeline],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 26))
        .map_err(|e| e.to_string())?;
    let (legend, rest) = root.split_vertically(LEGEND_HEIGHT);
    let (top, rest) = rest.split_vertically(HEIGHT * 36 / 100);
    let (middle, bottom) = rest.split_vertically(HEIGHT * 24 / 100);
    let (pool_legend, pools) = bottom.split_vertically(LEGEND_HEIGHT);
    let (share, cdf) = top.split_horizontally(WIDTH / 2);
    let policies: Vec<(&str, ShapeStyle)> = timelines
        .iter()
        .map(|t| (t.policy(), policy_style(t.policy())))
        .collect();
    legend_strip(&legend, &policies).map_err(|e| e.to_string())?;
    cache_share(&share, turn_label, timelines).map_err(|e| e.to_string())?;
    turn_time_cdf(&cdf, timelines).map_err(|e| e.to_string())?;
    capacity_waiters(&middle, timelines).map_err(|e| e.to_string())?;
    let lines: Vec<(&str, ShapeStyle)> = POOL_LINES
        .iter()
        .map(|(label, colour, _)| (*label, colour.stroke_width(2)))
        .collect();
    legend_strip(&pool_legend, &lines).map_err(|e| e.to_string())?;
    let panels = pools.split_evenly((1, timelines.len().max(1)));
    for (panel, timeline) in panels.iter().zip(timelines) {
        pool_pages(panel, timeline).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One row of legend entries (a short line in its style, then its label), centred in `area`.
fn legend_strip(area: &Area<'_>, entries: &[(&str, ShapeStyle)]) -> DrawResult {
    let font = ("sans-serif", 17).into_font();
    let widths: Vec<i32> = entries
        .iter()
        .map(|(label, _)| 40 + 9 * label.len() as i32 + 30)
        .collect();
    let total: i32 = widths.iter().sum();
    let (width, height) = area.dim_in_pixel();
    let mut x = (width as i32 - total).max(0) / 2;
    let y = height as i32 / 2;
    for ((label, style), entry_width) in entries.iter().zip(widths) {
        area.draw(&PathElement::new([(x, y), (x + 32, y)], *style))?;
        area.draw(&Text::new(label.to_string(), (x + 40, y - 9), font.clone()))?;
        x += entry_width;
    }
    Ok(())
}

/// Seconds as an axis shows them: whole seconds, or thousands (`12k`) on a long run.
fn seconds_label(t_max: f64) -> impl Fn(&f64) -> String {
    move |t| {
        if t_max >= 10_000.0 {
            format!("{:.0}k", t / 1000.0)
        } else if t_max >= 10.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.1}")
        }
    }
}

/// A label of a log axis: 1, 2 and 5 times a power of ten, the other ticks left blank so labels never
/// run together.
fn log_label(t: &f64) -> String {
    if *t <= 0.0 {
        return String::new();
    }
    let power = 10f64.powf(t.log10().floor());
    let mantissa = t / power;
    let nice = [1.0, 2.0, 5.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6 * m);
    match (nice, *t >= 1.0) {
        (false, _) => String::new(),
        (true, true) => format!("{t:.0}"),
        (true, false) => format!("{t}"),
    }
}

fn cache_share(area: &Area<'_>, turn_label: &str, timelines: &[Timeline]) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = timelines
        .iter()
        .map(|t| {
            t.cache_share_per_turn()
                .into_iter()
                .map(|(turn, pct)| (f64::from(turn + 1), pct))
                .collect()
        })
        .collect();
    let x_max = series.iter().flatten().map(|p| p.0).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Prompt tokens from cache (local hits and restores)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..x_max + 0.5, 0.0..105.0)?;
    chart
        .configure_mesh()
        .x_desc(turn_label)
        .y_desc("from cache (%)")
        .x_label_formatter(&|turn| format!("{turn:.0}"))
        .y_label_formatter(&|pct| format!("{pct:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    for (timeline, points) in timelines.iter().zip(series) {
        chart.draw_series(LineSeries::new(points, policy_style(timeline.policy())))?;
    }
    Ok(())
}

/// The turn-time CDF on a log time axis from the shortest turn to the longest.
fn turn_time_cdf(area: &Area<'_>, timelines: &[Timeline]) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = timelines.iter().map(Timeline::turn_time_cdf).collect();
    let positive = || series.iter().flatten().map(|p| p.0).filter(|t| *t > 0.0);
    let x_max = positive().fold(1e-3, f64::max) * 1.1;
    let x_min = positive().fold(x_max, f64::min).min(x_max / 10.0) * 0.9;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Turn time CDF (arrival to last token; log time axis)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..1.02)?;
    chart
        .configure_mesh()
        .x_desc("turn time (s)")
        .y_desc("fraction of turns")
        .x_label_formatter(&log_label)
        .light_line_style(WHITE)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    for (timeline, points) in timelines.iter().zip(series) {
        let points = points.into_iter().filter(|(t, _)| *t > 0.0);
        chart.draw_series(LineSeries::new(points, policy_style(timeline.policy())))?;
    }
    Ok(())
}

fn capacity_waiters(area: &Area<'_>, timelines: &[Timeline]) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = timelines
        .iter()
        .map(|t| {
            t.binned_samples(WAITER_BINS)
                .into_iter()
                .map(|s| (s.t_s, f64::from(s.capacity_waiters)))
                .collect()
        })
        .collect();
    let t_max = timelines
        .iter()
        .filter_map(|t| t.samples.last())
        .map(|s| s.t_s)
        .fold(1e-3, f64::max);
    let y_max = series.iter().flatten().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Capacity waiters: restores waiting for room, every policy (mean over 1/{WAITER_BINS} of the run)"
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("engine time (s)")
        .y_desc("waiters")
        .x_label_formatter(&seconds_label(t_max))
        .y_label_formatter(&|n| format!("{n:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    for (timeline, points) in timelines.iter().zip(series) {
        chart.draw_series(LineSeries::new(points, policy_style(timeline.policy())))?;
    }
    Ok(())
}

fn pool_pages(area: &Area<'_>, timeline: &Timeline) -> DrawResult {
    let samples = timeline.binned_samples(POOL_BINS);
    let t_max = samples.last().map_or(1e-3, |s| s.t_s.max(1e-3));
    let pool_max = samples
        .iter()
        .map(|s| f64::from(s.used_pages + s.free_pages))
        .fold(1.0, f64::max);
    let used_max = samples
        .iter()
        .map(|s| f64::from(s.used_pages))
        .fold(1.0, f64::max);
    // An unbounded pool (oracle): scaled to what it uses, its free pages off the chart.
    let (y_max, note) = if pool_max > 10.0 * used_max {
        (used_max * 1.25, " (free off scale)")
    } else {
        (pool_max * 1.05, "")
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("Pool pages: {}{note}", timeline.policy()),
            ("sans-serif", 18)
                .into_font()
                .color(&policy_colour(timeline.policy())),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("engine time (s)")
        .y_desc("pages")
        .x_labels(4)
        .y_labels(6)
        .x_label_formatter(&seconds_label(t_max))
        .y_label_formatter(&|pages| format!("{pages:.0}"))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;
    for (_, colour, value) in POOL_LINES {
        // A line that is off the scale everywhere (an unbounded pool's free pages) is left out, not drawn
        // along the top.
        if samples.iter().all(|s| value(s) > y_max) {
            continue;
        }
        let points = samples.iter().map(|s| (s.t_s, value(s).min(y_max)));
        chart.draw_series(LineSeries::new(points, colour.stroke_width(2)))?;
    }
    Ok(())
}
