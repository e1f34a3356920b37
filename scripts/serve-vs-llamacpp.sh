#!/usr/bin/env bash
# Side by side (issue 30, item 6): the agents workload as a streaming HTTP client (`kvgate agents --target`)
# against llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) and against `kvgate serve
# --executor model` under each policy, on the same .gguf, one server at a time, each alone. Not part of CI
# (CI does not build llama.cpp). Writes each client table and each server's CPU seconds under $OUT.
#
#   scripts/serve-vs-llamacpp.sh            # needs target/debug/kvgate (cargo build -p kvgate) and the venv
#
# Knobs (environment): LLAMACPP_VENV (a venv with llama-cpp-python[server]), KVGATE (the binary), MODEL (the
# .gguf), THREADS (compute threads of each server), POOL_PAGES (kvgate's pool, 16-token pages), N_CTX
# (llama.cpp's context, tokens), POLICIES (empty: llama.cpp only), SKIP_LLAMACPP, OUT, and the workload:
# AGENTS TURNS FIRST INPUT RESPONSE THINK SEED.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP_VENV=${LLAMACPP_VENV:-/tmp/llamacpp/venv}
KVGATE=${KVGATE:-target/debug/kvgate}
MODEL=${MODEL:-$HOME/.cache/kvgate/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
POOL_PAGES=${POOL_PAGES:-24}
N_CTX=${N_CTX:-$((POOL_PAGES * 16))}
POLICIES=${POLICIES-"reserved oracle pages-only ordinary"}
OUT=${OUT:-/tmp/serve-vs-llamacpp}
AGENTS=${AGENTS:-4} TURNS=${TURNS:-3} FIRST=${FIRST:-100} INPUT=${INPUT:-16} RESPONSE=${RESPONSE:-16}
THINK=${THINK:-0.5} SEED=${SEED:-7}
PORT=${PORT:-18431}
NAME=SmolLM2-135M-Instruct
mkdir -p "$OUT"
tck=$(getconf CLK_TCK)

wait_up() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "the server on port $PORT did not come up" >&2
  return 1
}

# run LABEL CMD...: starts the server, runs the client, reports the server's CPU seconds, stops the server.
run() {
  local label=$1
  shift
  echo "== $label ($(uptime | sed 's/.*load/load/'))"
  "$@" >"$OUT/$label.server.log" 2>&1 &
  local pid=$!
  wait_up
  local client_rc=0
  /usr/bin/time -f "client cpu %U+%S s, wall %e s" "$KVGATE" agents --target "http://127.0.0.1:$PORT" \
    --model-name "$NAME" --agents "$AGENTS" --turns "$TURNS" --first-prompt-tokens "$FIRST" \
    --turn-input-tokens "$INPUT" --response-tokens "$RESPONSE" --think-s "$THINK" --seed "$SEED" \
    >"$OUT/$label.table" 2>"$OUT/$label.client.err" || client_rc=$?
  local cpu
  cpu=$(awk -v t="$tck" '{printf "%.1f", ($14 + $15) / t}' "/proc/$pid/stat")
  kill -TERM "$pid"
  wait "$pid" || true
  echo "server cpu (user+sys) $cpu s; client exit $client_rc" >>"$OUT/$label.table"
  cat "$OUT/$label.client.err" >>"$OUT/$label.table"
  cat "$OUT/$label.table"
}

# llama.cpp: one slot keeping the last prompt's KV (prefix reuse), no store behind it, one request at a time
# (--interrupt_requests false: by default a new request cuts the streaming one short); its log says how many
# prompt tokens each request took from that slot ("prefix-match hit").
if [ -z "${SKIP_LLAMACPP:-}" ]; then
  run llamacpp "$LLAMACPP_VENV/bin/python" -m llama_cpp.server --model "$MODEL" --model_alias "$NAME" \
    --n_ctx "$N_CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS" --host 127.0.0.1 --port "$PORT" \
    --interrupt_requests false --verbose true
  hits=$(grep -o '[0-9]* prefix-match hit' "$OUT/llamacpp.server.log" | awk '{s += $1} END {print s + 0}')
  echo "llama.cpp prefix-match hits (its log): $hits tokens" | tee -a "$OUT/llamacpp.table"
fi

for policy in $POLICIES; do
  RAYON_NUM_THREADS=$THREADS run "kvgate-$policy" "$KVGATE" serve --executor model --model "$MODEL" \
    --policy "$policy" --pool-pages "$POOL_PAGES" --addr "127.0.0.1:$PORT"
done
