"""kvgate from Python, notebook style: the agents comparison, one plot, and a replay sweep over pool sizes.

Install the package first (README, "Python"), then run from the repository root:

    python docs/python_example.py [OUT_DIR]

It prints the policies side by side, draws the share of prompt tokens served from cache per turn into
OUT_DIR/python_example.png when matplotlib is installed (says so and goes on when it is not), and replays
the small Mooncake trace of tests/workloads on pools of four sizes. Every figure comes from the same runs
as `kvgate agents --json` and `kvgate replay --json`: the reports are plain dicts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kvgate

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
# A seeded Mooncake-format trace of 200 requests, from the command line's generator.
TRACE = OUT_DIR / "trace.jsonl"
with open(TRACE, "w", encoding="utf-8") as out:
    subprocess.run(
        ["cargo", "run", "--release", "-q", "-p", "kvgate", "--", "trace", "generate", "--seed", "0",
         "--requests", "200", "--rate", "4"],
        cwd=ROOT, stdout=out, check=True,
    )

# %% The agents comparison: eight sessions of 32 turns outgrow the pool about four times over.
last = {}


def progress(policy: str, done: int, total: int) -> None:
    last[policy] = done


report = kvgate.agents(series=True, progress=progress)
columns = {"prompt_tokens_from_cache_pct": "from cache %", "later_turns_restored": "restored",
           "mean_turn_s": "mean turn s", "p99_ttft_s": "p99 ttft s", "preemptions": "preemptions",
           "leaked_pages": "leaked"}
print(f"{'policy':<12}" + "".join(f"{name:>13}" for name in columns.values()))
for run in report["runs"]:
    print(f"{run['policy']:<12}" + "".join(f"{run[c]:>13}" for c in columns))
print(f"progress seen at the end: {last}\n")

# %% One plot: the share of prompt tokens from cache, turn by turn, per policy.
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib)\n")
else:
    figure, axes = plt.subplots(figsize=(7, 4))
    for run in report["runs"]:
        requests = run["series"]["requests"]
        by_turn = {}
        for turn, prompt, hit, restored in zip(
            requests["turn"], requests["prompt_tokens"],
            requests["prompt_tokens_local_hit"], requests["prompt_tokens_restored"],
        ):
            cached, total = by_turn.get(turn, (0, 0))
            by_turn[turn] = (cached + hit + restored, total + prompt)
        turns = sorted(by_turn)
        axes.plot(turns, [100 * by_turn[t][0] / by_turn[t][1] for t in turns], label=run["policy"])
    axes.set_xlabel("turn")
    axes.set_ylabel("prompt tokens from cache (%)")
    axes.set_title("kvgate agents: 8 sessions x 32 turns")
    axes.legend()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    figure.savefig(OUT_DIR / "python_example.png", dpi=100, bbox_inches="tight")
    print(f"plot written to {OUT_DIR / 'python_example.png'}\n")

# %% A replay sweep over pool sizes: how much of the trace each policy serves from cache.
print(f"{'pool pages':>10}  " + "  ".join(f"{p:>11}" for p in kvgate.POLICIES) + "  (% prompt tokens from cache)")
for pages in (2048, 4096, 8192, 16384):
    sweep = kvgate.replay(TRACE, pool_pages=pages, time_scale=2.0)
    cells = {run["policy"]: run["prompt_tokens_from_cache_pct"] for run in sweep["runs"]}
    print(f"{pages:>10}  " + "  ".join(f"{cells[p]:>11.1f}" for p in kvgate.POLICIES))
print(f"the trace allows at most {sweep['theoretical_max_hit_pct']:.1f}%")
