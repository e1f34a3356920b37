"""The simulator's runs from Python: the same reports as the command line, series, progress, Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import _thread

import pytest

import kvgate
from conftest import SCENARIOS, TRACE, without_wall_time

SMALL = dict(agents=3, turns=4, seed=5)


def same_as_the_command_line(got, expected):
    """The Python report equals the command line's whole: every field, the header's and the runs', in the
    same order (only wall-clock times differ between two runs)."""
    got, expected = without_wall_time(got), without_wall_time(expected)
    assert list(got) == list(expected)
    assert got["runs"] == expected["runs"]
    assert got == expected


def test_agents_report_equals_the_command_line(cli):
    expected = cli(["agents", "--agents", "3", "--turns", "4", "--seed", "5", "--json"])
    got = kvgate.agents(**SMALL)
    assert [run["policy"] for run in got["runs"]] == list(kvgate.POLICIES)
    same_as_the_command_line(got, expected)
    assert got["runs"][0]["prompt_tokens"] > 0


def test_agents_options_reach_the_run_as_on_the_command_line(cli):
    args = ["agents", "--agents", "4", "--turns", "3", "--pool-pages", "300", "--policy", "reserved"]
    args += ["--turn-priority", "progress", "--preemption", "recompute", "--think-s", "0.5", "--json"]
    expected = cli(args)
    got = kvgate.agents(
        agents=4, turns=3, pool_pages=300, policies="reserved", turn_priority="progress",
        preemption="recompute", think_s=0.5,
    )
    assert got["turn_priority"] == "progress"
    same_as_the_command_line(got, expected)


def test_replay_report_equals_the_command_line(cli):
    expected = cli(["replay", str(TRACE), "--pool-pages", "2048", "--time-scale", "2", "--json"])
    got = kvgate.replay(TRACE, pool_pages=2048, time_scale=2.0)
    same_as_the_command_line(got, expected)
    assert got["theoretical_max_hit_pct"] > 0


def test_cluster_replay_report_equals_the_command_line(cli):
    args = ["replay", str(TRACE), "--engines", "2", "--router", "round-robin", "--limit", "120"]
    expected = cli(args + ["--policy", "reserved,ordinary", "--json"])
    got = kvgate.replay(
        str(TRACE), engines=2, router="round-robin", limit=120, policies=["reserved", "ordinary"]
    )
    same_as_the_command_line(got, expected)
    assert len(got["runs"][0]["engines"]) == 2
    assert "meets_ttft_slo" in got["runs"][0]["keep_up"]


def test_scenario_trace_equals_the_command_line(cli):
    path = SCENARIOS / "capacity_wait.json"
    expected = cli(["scenario", str(path), "--json"])
    got = kvgate.scenario(path)
    assert without_wall_time(got) == without_wall_time(expected)
    assert got["steps"]


def test_series_has_one_row_per_step_and_per_request():
    report = kvgate.agents(policies="reserved", series=True, **SMALL)
    series = report["runs"][0]["series"]
    steps, requests = series["steps"], series["requests"]
    n_steps = len(steps["t_s"])
    assert n_steps > 0
    assert all(len(column) == n_steps for column in steps.values())
    assert steps["t_s"] == sorted(steps["t_s"])
    assert len(requests["id"]) == 3 * 4
    assert sorted(set(requests["turn"])) == [0, 1, 2, 3]
    assert sorted(set(requests["session"])) == [0, 1, 2]
    assert "series" not in kvgate.agents(policies="reserved", **SMALL)["runs"][0]


def test_progress_reports_every_policy_to_its_end():
    seen = {}

    def progress(policy, done, total):
        assert 0 <= done <= total
        seen[policy] = (done, total)

    kvgate.agents(progress=progress, **SMALL)
    assert seen == {policy: (12, 12) for policy in kvgate.POLICIES}


def test_an_exception_in_the_progress_callback_stops_the_run_and_propagates():
    class Stop(Exception):
        pass

    def progress(policy, done, total):
        raise Stop(policy)

    with pytest.raises(Stop):
        kvgate.agents(agents=8, turns=32, progress=progress)


def test_ctrl_c_midway_stops_the_run_with_keyboard_interrupt():
    seen = []

    def progress(policy, done, total):
        seen.append((done, total))
        if len(seen) == 1:
            _thread.interrupt_main()  # what Ctrl-C does: SIGINT's handler sets the interrupt flag

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kvgate.agents(agents=64, turns=64, progress=progress)
    assert seen and all(done < total for done, total in seen)
    assert time.monotonic() - started < 60


def test_sigint_to_a_python_process_interrupts_a_long_run():
    script = (
        "import sys, kvgate\n"
        "seen = []\n"
        "def progress(policy, done, total):\n"
        "    if not seen:\n"
        "        print('started', flush=True)\n"
        "    seen.append(done)\n"
        "kvgate.agents(agents=256, turns=256, progress=progress)\n"
        "print('finished', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "started"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    assert "finished" not in out


def test_a_run_releases_the_gil():
    ticks = []
    running = threading.Event()
    stop = threading.Event()

    def count():
        running.set()
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    thread = threading.Thread(target=count)
    thread.start()
    running.wait()
    before = len(ticks)
    started = time.monotonic()
    kvgate.agents(agents=8, turns=16)
    elapsed = time.monotonic() - started
    stop.set()
    thread.join()
    # The counter thread kept running through the run: at least a tick every 20 ms of it.
    assert len(ticks) - before >= elapsed / 0.02


def test_a_live_run_on_the_reference_model_serves_later_turns_from_cache_and_leaks_nothing():
    report = kvgate.agents(executor="reference", agents=2, turns=2, policies="reserved", series=True)
    (run,) = report["runs"]
    # The tiny model keeps recurrent state, so a resident session's next turn is a local hit (H9) where it
    # is still cached and a restore from the store where it is not: both serve it from cache.
    assert run["later_turns_restored"] + run["later_turns_local_hit"] == 2
    assert run["leaked_pages"] == 0
    assert run["aggregate_decode_tok_s"] > 0
    assert len(run["series"]["requests"]["id"]) == 4


def test_a_replay_series_has_a_row_per_request_of_the_trace():
    report = kvgate.replay(TRACE, limit=50, policies="oracle", series=True)
    requests = report["runs"][0]["series"]["requests"]
    assert sorted(requests["id"]) == list(range(50))
    assert "turn" not in requests


def test_an_exception_in_the_progress_callback_stops_a_cluster_replay():
    calls = []

    def progress(policy, done, total):
        calls.append(done)
        raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        kvgate.replay(TRACE, engines=2, policies="reserved", progress=progress)
    assert len(calls) == 1
