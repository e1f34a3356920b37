//! Every shipped model preset runs the default agents workload (H8): under `reserved` at least 98% of prompt
//! tokens come from cache, every later turn is served from cache, nothing leaks; `ordinary` and
//! `pages-only` serve less, by their mechanism (restores refused at once, published pages evicted before
//! their consumer is admitted).

use engine::{FallbackReason, Policy};
use kvgate::MODEL_PRESETS;
use kvgate::run;
use kvgate::workload::agents::AgentsSpec;

#[test]
fn h8_every_model_preset_serves_at_least_98_percent_from_cache_under_reserved() {
    for name in MODEL_PRESETS {
        let mut config = crate::verified_config();
        config.apply_preset(name).unwrap();
        config.pool.pages = run::agents_pool_pages(&config);
        let spec = AgentsSpec::default();
        let metrics = |policy| run::run_agents(&config, &spec, policy, &mut |_, _| {}).unwrap();
        let reserved = metrics(Policy::Reserved);
        assert!(
            reserved.prompt_tokens_from_cache_pct >= 98.0,
            "{name}: {}%",
            reserved.prompt_tokens_from_cache_pct
        );
        assert_eq!(
            reserved.later_turns_restored + reserved.later_turns_local_hit,
            reserved.later_turns,
            "{name}: every later turn from cache"
        );
        assert_eq!(reserved.leaked_pages, 0, "{name}");
        let ordinary = metrics(Policy::Ordinary);
        let pages_only = metrics(Policy::PagesOnly);
        for (policy, run, cause) in [
            ("ordinary", &ordinary, FallbackReason::NoPagesAtOnce),
            (
                "pages-only",
                &pages_only,
                FallbackReason::EvictedBeforeAdmission,
            ),
        ] {
            assert!(
                run.prompt_tokens_from_cache_pct < reserved.prompt_tokens_from_cache_pct,
                "{name}, {policy}"
            );
            assert!(
                run.restore_fallbacks
                    .get(cause.name())
                    .copied()
                    .unwrap_or(0)
                    > 0,
                "{name}, {policy} loses by its mechanism: {:?}",
                run.restore_fallbacks
            );
            assert_eq!(run.leaked_pages, 0, "{name}, {policy}");
        }
    }
}
