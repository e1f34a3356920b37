#!/usr/bin/env bash
# The reports a behaviour-neutral change must leave identical (issues 28 and 34): run it with the binary
# before and after the change, then `diff -r BEFORE AFTER` must be empty. Writes, under OUT, the `--json`
# reports (wall-clock and CPU fields stripped) of: `replay` of the conversation trace at 8,192 and 65,536
# pages under the four policies, two policies on four engines, a generated long-prompt trace; `agents` for
# the default and the three hybrid presets; every scenario (its per-step trace) and the incident suite's summary. Each replay's stderr goes
# to `err_*`, its log timestamps and wall-clock progress lines stripped, so `diff -r` compares those too.
#
#   scripts/golden.sh OUT [KVGATE_BIN]      # default binary: target/release/kvgate
set -u
cd "$(dirname "$0")/.."
OUT=$1
B=${2:-target/release/kvgate}
T=../shared/workloads/mooncake/conversation_trace.jsonl
mkdir -p "$OUT"
# A replay's stderr without what depends on the wall clock: log timestamps and progress lines.
strip_err() {
  sed -E 's/^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z +//; /requests finished after/d'
}
strip() {
  jq -S 'walk(if type == "object" then with_entries(select(.key | test("wall|cpu_s|elapsed") | not)) else . end)'
}
for pages in 8192 65536; do
  for p in ordinary pages-only reserved oracle; do
    "$B" replay "$T" --pool-pages $pages --policy $p --json 2>"$OUT/stderr.tmp" | strip >"$OUT/replay_${pages}_$p.json"
    strip_err <"$OUT/stderr.tmp" >"$OUT/err_replay_${pages}_$p"
  done
done
for p in ordinary reserved; do
  "$B" replay "$T" --pool-pages 8192 --engines 4 --policy $p --json 2>/dev/null | strip >"$OUT/replay4_8192_$p.json"
done
"$B" agents --json 2>/dev/null | strip >"$OUT/agents.json"
for preset in glm-mla-hybrid linear-hybrid sliding-window; do
  "$B" agents --preset $preset --json 2>/dev/null | strip >"$OUT/agents_$preset.json"
done
for f in tests/scenarios/*.json tests/scenarios/incidents/*.json; do
  "$B" scenario "$f" --json 2>/dev/null | strip >"$OUT/scenario_$(basename "$(dirname "$f")")_$(basename "$f")"
done
"$B" scenario --suite tests/scenarios/incidents >"$OUT/incident_suite.txt" 2>/dev/null
gen=$(mktemp)
"$B" trace generate --seed 5 --requests 3000 --prompt long --reuse low --arrival steady --rate 4 >"$gen" 2>/dev/null
for p in ordinary reserved; do
  "$B" replay "$gen" --pool-pages 8192 --policy $p --json 2>/dev/null | strip >"$OUT/replay_gen_$p.json"
done
rm -f "$gen" "$OUT/stderr.tmp"
echo "golden: $(ls "$OUT" | wc -l) files in $OUT"
