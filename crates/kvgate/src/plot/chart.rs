//! Drawing: the four charts of `Timeline`s on one SVG page. Top: cache share per turn and the turn-time CDF;
//! middle: capacity waiters over time; bottom: pool pages over time, one panel per policy. Each policy has
//! one colour everywhere.

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::Timeline;

const WIDTH: u32 = 1500;
const HEIGHT: u32 = 1250;

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

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

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
    let (top, rest) = root.split_vertically(HEIGHT * 4 / 10);
    let (middle, bottom) = rest.split_vertically(HEIGHT * 27 / 100);
    let (share, cdf) = top.split_horizontally(WIDTH / 2);
    cache_share(&share, turn_label, timelines).map_err(|e| e.to_string())?;
    turn_time_cdf(&cdf, timelines).map_err(|e| e.to_string())?;
    capacity_waiters(&middle, timelines).map_err(|e| e.to_string())?;
    let panels = bottom.split_evenly((1, timelines.len().max(1)));
    for (panel, timeline) in panels.iter().zip(timelines) {
        pool_pages(panel, timeline).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One line of a pool panel: its label, colour and value per sample.
type Layer = (&'static str, RGBColor, fn(&super::Sample) -> f64);

type DrawResult = Result<(), Box<dyn std::error::Error>>;

type Chart2d<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn legend<'a>(chart: &mut Chart2d<'a, 'a>, position: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// One panel with a line per policy, in the policy's colour.
struct PolicyPanel<'a> {
    caption: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    x_range: std::ops::Range<f64>,
    y_range: std::ops::Range<f64>,
    legend_at: SeriesLabelPosition,
}

impl PolicyPanel<'_> {
    fn draw(
        self,
        area: &Area<'_>,
        timelines: &[Timeline],
        series: Vec<Vec<(f64, f64)>>,
    ) -> DrawResult {
        let mut chart = ChartBuilder::on(area)
            .caption(self.caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(self.x_range, self.y_range)?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .draw()?;
        for (timeline, points) in timelines.iter().zip(series) {
            let style = policy_style(timeline.policy());
            chart
                .draw_series(LineSeries::new(points, style))?
                .label(timeline.policy())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        }
        legend(&mut chart, self.legend_at)
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
    PolicyPanel {
        caption: "Prompt tokens from cache, per turn",
        x_desc: turn_label,
        y_desc: "from cache (%)",
        x_range: 0.5..x_max + 0.5,
        y_range: 0.0..105.0,
        legend_at: SeriesLabelPosition::MiddleRight,
    }
    .draw(area, timelines, series)
}

fn turn_time_cdf(area: &Area<'_>, timelines: &[Timeline]) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = timelines.iter().map(Timeline::turn_time_cdf).collect();
    let x_max = series.iter().flatten().map(|p| p.0).fold(1e-3, f64::max);
    PolicyPanel {
        caption: "Turn time CDF (arrival to last token)",
        x_desc: "turn time (s)",
        y_desc: "fraction of turns",
        x_range: 0.0..x_max * 1.02,
        y_range: 0.0..1.02,
        legend_at: SeriesLabelPosition::LowerRight,
    }
    .draw(area, timelines, series)
}

fn capacity_waiters(area: &Area<'_>, timelines: &[Timeline]) -> DrawResult {
    let series: Vec<Vec<(f64, f64)>> = timelines
        .iter()
        .map(|t| {
            t.binned_samples()
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
    PolicyPanel {
        caption: "Capacity waiters (restores waiting for room; mean over 1/400 of the run)",
        x_desc: "engine time (s)",
        y_desc: "waiters",
        x_range: 0.0..t_max,
        y_range: 0.0..y_max * 1.1,
        legend_at: SeriesLabelPosition::UpperRight,
    }
    .draw(area, timelines, series)
}

fn pool_pages(area: &Area<'_>, timeline: &Timeline) -> DrawResult {
    let samples = timeline.binned_samples();
    let t_max = samples.last().map_or(1e-3, |s| s.t_s.max(1e-3));
    let pool_max = samples
        .iter()
        .map(|s| f64::from(s.used_pages + s.free_pages))
        .fold(1.0, f64::max);
    let used_max = samples
        .iter()
        .map(|s| f64::from(s.used_pages + s.credit_pages))
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
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("engine time (s)")
        .y_desc("pages")
        .x_labels(4)
        .y_label_formatter(&|pages| format!("{pages:.0}"))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;
    let used = RGBColor(0x44, 0x44, 0x44);
    let credit = RGBColor(0x94, 0x67, 0xbd);
    let free = RGBColor(0x17, 0xbe, 0xcf);
    let layers: [Layer; 3] = [
        ("used", used, |s| f64::from(s.used_pages)),
        ("free, credit-protected", credit, |s| {
            f64::from(s.credit_pages)
        }),
        // Running decodes may dip into credit-protected pages (C5): free can be below the credits.
        ("free", free, |s| {
            f64::from(s.free_pages.saturating_sub(s.credit_pages))
        }),
    ];
    for (label, colour, value) in layers {
        let points = samples.iter().map(|s| (s.t_s, value(s).min(y_max)));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
