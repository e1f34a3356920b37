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
