//! The chart of a small agents run: an SVG whose legend names every policy and which holds a line in each
//! policy's colour.

use engine::Policy;

use super::{Timeline, chart::policy_colour, write_svg};
use crate::run::{self, agent_turn};

#[test]
fn the_agents_chart_has_a_series_for_every_policy() {
    let (config, spec) = run::small_agents();
    let timelines: Vec<Timeline> = Policy::ALL
        .iter()
        .map(|&policy| {
            let spec_copy = spec.clone();
            let mut timeline = Timeline::new(policy.name(), move |id| agent_turn(&spec_copy, id).1);
            run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut timeline)
                .unwrap();
            assert!(
                !timeline.samples.is_empty() && timeline.turns.len() == 16,
                "{timeline:?}"
            );
            timeline
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = write_svg(dir.path(), "agents", "agents", "turn", &timelines).unwrap();
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    for policy in Policy::ALL {
        let name = policy.name();
        let RGBColor(r, g, b) = policy_colour(name);
        let stroke = format!("stroke=\"#{r:02X}{g:02X}{b:02X}\"");
        let lines = svg
            .match_indices("<polyline")
            .filter(|(at, _)| {
                svg[*at..]
                    .split('>')
                    .next()
                    .is_some_and(|tag| tag.contains(&stroke))
            })
            .count();
        // Cache share, CDF and waiters, plus a legend entry each: at least three lines.
        assert!(lines >= 3, "{name}: {lines} lines with {stroke}");
        assert!(
            svg.contains(&format!(">{name}</text>"))
                || svg.contains(&format!(">\n{name}\n</text>")),
            "{name} in no legend"
        );
        assert!(
            svg.contains(&format!("Pool pages: {name}")),
            "no pool panel for {name}"
        );
    }
}

use plotters::style::RGBColor;

/// The chart draws the numbers the table prints: per policy, the cache share over every turn is the table's
/// "prompt tokens from cache", the CDF holds every finished turn and their mean is the table's mean turn
/// time, and a policy the table counts capacity waits for (pages-only included) has waiters on the chart.
#[test]
fn the_chart_series_come_from_the_numbers_of_the_table() {
    let (config, spec) = run::small_agents();
    let mut waits_seen = 0;
    for policy in Policy::ALL {
        let spec_copy = spec.clone();
        let mut timeline = Timeline::new(policy.name(), move |id| agent_turn(&spec_copy, id).1);
        let run = run::run_agents_observed(&config, &spec, policy, &mut |_, _| {}, &mut timeline)
            .unwrap();
        let (cached, prompt) = timeline.cached_and_prompt_tokens();
        assert_eq!(
            cached,
            run.prompt_tokens_local_hit + run.prompt_tokens_restored,
            "{policy:?}"
        );
        assert_eq!(prompt, run.prompt_tokens, "{policy:?}");
        let share = 100.0 * cached as f64 / prompt as f64;
        assert!(
            (share - run.prompt_tokens_from_cache_pct).abs() < 1e-9,
            "{policy:?}: {share} against {}",
            run.prompt_tokens_from_cache_pct
        );
        let times = timeline.turn_times_s();
        assert_eq!(times.len(), run.requests_finished as usize, "{policy:?}");
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        assert!(
            (mean - run.mean_turn_s).abs() < 1e-9,
            "{policy:?}: {mean} against {}",
            run.mean_turn_s
        );
        assert_eq!(
            timeline.peak_capacity_waiters() > 0,
            run.capacity_waits > 0,
            "{policy:?}: {} waits in the report",
            run.capacity_waits
        );
        waits_seen += run.capacity_waits;
    }
    assert!(
        waits_seen > 0,
        "no policy waited: the comparison compares nothing"
    );
}
