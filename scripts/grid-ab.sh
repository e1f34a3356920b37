#!/usr/bin/env bash
# Binaries side by side on the replay grid's cells, with and without a checkpoint store, against the peer
# (issue 34 part 4): each run alone, one after another, `/usr/bin/time -f '%U %S %M'` (CPU = user + sys).
# Appends one line per run to OUT: round trace pages binary policy store user sys max_rss_kib.
#
#   scripts/grid-ab.sh OUT ROUNDS KVGATE_BIN...
#
# Traces: the shared conversation trace and the grid's four generated shapes (`kvgate trace generate --seed
# 0`, as `xtask/src/bench/grid.rs` makes them), written next to OUT. The peer: `$MOCKER_BENCH_BIN`, else where
# `../shared/peer/mocker-bench/run.sh` builds it; skipped when absent.
set -u
cd "$(dirname "$0")/.."
OUT=$1
ROUNDS=$2
shift 2
DIR=$(dirname "$OUT")
PEER=${MOCKER_BENCH_BIN:-${TMPDIR:-/tmp}/mocker-bench-target/release/mocker-bench}
traces="conversation:../shared/workloads/mooncake/conversation_trace.jsonl"
for shape in short-high-steady:12000:20 short-low-bursty:12000:20 long-high-bursty:3000:4 long-low-steady:3000:4; do
  IFS=: read -r name n rate <<<"$shape"
  IFS=- read -r prompt reuse arrival <<<"$name"
  "$1" trace generate --seed 0 --requests "$n" --prompt "$prompt" --reuse "$reuse" --arrival "$arrival" \
    --rate "$rate" >"$DIR/$name.jsonl"
  traces="$traces $name:$DIR/$name.jsonl"
done
for round in $(seq 1 "$ROUNDS"); do
  for t in $traces; do
    name=${t%%:*}
    file=${t#*:}
    for pages in 8192 65536; do
      if [ -x "$PEER" ]; then
        /usr/bin/time -a -o "$OUT" -f "$round $name $pages peer - - %U %S %M" "$PEER" "$file" "$pages" >/dev/null 2>&1
      fi
      for bin in "$@"; do
        for store in store nostore; do
          for policy in ordinary reserved; do
            extra=()
            [ "$store" = nostore ] && extra=(--store-pages 1)
            /usr/bin/time -a -o "$OUT" -f "$round $name $pages $(basename "$bin") $policy $store %U %S %M" \
              "$bin" replay "$file" --pool-pages "$pages" --policy "$policy" "${extra[@]}" --json >/dev/null 2>&1
          done
        done
      done
    done
  done
done
