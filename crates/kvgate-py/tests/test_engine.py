"""The engine from Python, as a scheduler drives it: build, submit, step, views, cancel, shutdown, metrics."""

from __future__ import annotations

import pytest

import kvgate
from conftest import TRACE

CONFIG = {"pool": {"pages": 64}, "restore": {"verify": True}}


def prompt(n, offset=0):
    return [offset + i for i in range(n)]


def run_to_idle(engine, steps_max=10_000):
    reports = []
    while not engine.is_idle():
        reports.append(engine.step())
        assert len(reports) < steps_max
    return reports


def test_an_engine_serves_submitted_requests_step_by_step():
    engine = kvgate.Engine(CONFIG, policy="reserved", seed=3)
    assert engine.policy == "reserved" and engine.is_idle() and engine.now_s == 0.0
    engine.submit(1, prompt(100), 8)
    engine.submit(2, prompt(60, 1000), 4, arrival_s=0.5, priority=2)
    assert engine.n_live_requests == 2
    view = engine.request(1)
    assert view["phase"] in {"arriving", "waiting"} and view["n_computed"] == 0
    reports = run_to_idle(engine)
    assert any(r["prefills"] for r in reports) and reports[-1]["idle"]
    assert {1, 2} == {i for r in reports for i in r["finished"]}
    finished = {done["id"]: done for done in engine.take_finished()}
    assert len(finished[1]["output"]) == 8 and len(finished[2]["output"]) == 4
    assert not finished[1]["cancelled"] and finished[2]["metrics"]["arrival_s"] == 0.5
    metrics = engine.metrics()
    assert metrics["prompt_tokens"] == 160 and metrics["leaked_pages"] == 0
    assert metrics["policy"] == "reserved"
    assert sorted(m["id"] for m in engine.request_metrics()) == [1, 2]
    assert engine.request(1) is None
    assert engine.now_s > 0


def test_a_later_turn_hits_the_prefix_the_first_left_in_the_pool():
    engine = kvgate.Engine(CONFIG)
    engine.submit(1, prompt(96), 2)
    run_to_idle(engine)
    engine.submit(2, prompt(96) + prompt(32, 500), 2, is_later_turn=True)
    run_to_idle(engine)
    later = [m for m in engine.request_metrics() if m["id"] == 2][0]
    assert later["prompt_tokens_local_hit"] > 0


def test_cancel_and_shutdown():
    engine = kvgate.Engine(CONFIG)
    engine.submit(1, prompt(50), 100)
    engine.submit(2, prompt(50, 100), 100)
    engine.step()
    engine.cancel(1)
    done = engine.take_finished()
    assert [d["id"] for d in done] == [1] and done[0]["cancelled"]
    report = engine.shutdown()
    assert report["cancelled"] == [2] and report["copies_drained"] >= 0
    assert engine.is_idle()


def test_a_trace_record_is_submitted_as_the_replay_submits_it():
    record = {"timestamp": 250, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]}
    engine = kvgate.Engine({"pool": {"pages": 256}})
    engine.submit_trace_record(7, record)
    run_to_idle(engine)
    (done,) = engine.take_finished()
    assert done["id"] == 7 and len(done["output"]) == 3
    assert done["metrics"]["arrival_s"] == 0.25 and done["metrics"]["prompt_tokens"] == 700


def test_an_engine_is_built_from_a_toml_file_or_text(tmp_path):
    path = tmp_path / "engine.toml"
    path.write_text("[pool]\npages = 100\n")
    for engine in (kvgate.Engine(path), kvgate.Engine(str(path)), kvgate.Engine(toml="[pool]\npages = 100\n")):
        engine.submit(1, prompt(10), 1)
        run_to_idle(engine)
        assert engine.metrics()["prompt_tokens"] == 10


def test_reset_refused_while_pages_are_in_use_is_pressure():
    engine = kvgate.Engine(CONFIG)
    engine.submit(1, prompt(64), 50)
    while engine.request(1)["n_pages"] == 0:
        engine.step()
    with pytest.raises(kvgate.PressureError, match="retry or force it"):
        engine.reset_prefix_cache()
    engine.reset_prefix_cache(force=True)
    run_to_idle(engine)


def test_a_request_larger_than_the_model_is_impossible():
    engine = kvgate.Engine({"model": {"max_model_len": 256}})
    with pytest.raises(kvgate.ImpossibleError, match="rejected"):
        engine.submit(1, prompt(300), 4)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda e: e.submit(1, "hello", 4), TypeError, "not a string"),
        (lambda e: e.submit(1, [1, -2], 4), ValueError, "prompt[...] = -2 is out of range"),
        (lambda e: e.submit(1, [1, 2**33], 4), ValueError, "out of range"),
        (lambda e: e.submit(1, [1, 2.0], 4), TypeError, "must be an int"),
        (lambda e: e.submit(1, 5, 4), TypeError, "not iterable"),
        (lambda e: e.submit(-1, [1], 4), ValueError, "id = -1"),
        (lambda e: e.submit(1, [1], -4), ValueError, "max_output_tokens"),
        (lambda e: e.submit(1, [], 4), kvgate.InvalidError, "empty prompt"),
        (lambda e: e.submit(1, [1], 4, arrival_s=float("nan")), kvgate.InvalidError, "arrival_s"),
        (lambda e: e.submit(1, [1], 4, arrival_s=-1.0), kvgate.InvalidError, "arrival_s"),
        (lambda e: e.submit(1, [1], 4, arrival_s=1e300), kvgate.InvalidError, "arrival_s"),
        (lambda e: e.submit(1, [1], 4, priority=2**31), ValueError, "priority"),
        (lambda e: e.submit(1, [1], 4, is_later_turn=1), TypeError, "is_later_turn"),
        (lambda e: e.cancel(99), kvgate.InvalidError, "no live request req-99"),
        (lambda e: e.cancel("1"), TypeError, "id must be an int"),
        (lambda e: e.request(-1), ValueError, "id = -1"),
        (lambda e: e.submit_trace_record(1, [1, 2]), TypeError, "record must be a dict"),
        (lambda e: e.submit_trace_record(1, {"timestamp": 0}), kvgate.InvalidError, "missing field"),
        (
            lambda e: e.submit_trace_record(1, {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [], "x": 1}),
            kvgate.InvalidError,
            "unknown field",
        ),
    ],
)
def test_engine_calls_refuse_bad_arguments(call, error, message):
    engine = kvgate.Engine(CONFIG)
    with pytest.raises(error) as raised:
        call(engine)
    assert message in str(raised.value)


def test_a_duplicate_live_id_is_invalid():
    engine = kvgate.Engine(CONFIG)
    engine.submit(1, prompt(10), 4)
    with pytest.raises(kvgate.InvalidError, match="already live"):
        engine.submit(1, prompt(10), 4)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: kvgate.Engine(policy="lifo"), kvgate.InvalidError, "unknown policy"),
        (lambda: kvgate.Engine(policy=3), TypeError, "policy must be a str"),
        (lambda: kvgate.Engine(toml="[[["), kvgate.InvalidError, "config"),
        (lambda: kvgate.Engine({"pool": {"pages": 0}}), kvgate.InvalidError, "pool.pages"),
        (lambda: kvgate.Engine({}, toml=""), TypeError, "not both"),
        (lambda: kvgate.Engine(seed=-1), ValueError, "seed"),
        (lambda: kvgate.Engine("/no/such.toml"), FileNotFoundError, "/no/such.toml"),
        (lambda: kvgate.Engine(5), TypeError, "config must be a path"),
    ],
)
def test_an_engine_refuses_a_bad_config(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert message in str(raised.value)


def test_the_error_classes_form_one_hierarchy():
    for kind in (kvgate.PressureError, kvgate.ImpossibleError, kvgate.InvalidError, kvgate.InternalError):
        assert issubclass(kind, kvgate.KvgateError)
    assert issubclass(kvgate.InvalidError, ValueError)
    assert kvgate.__version__ == "0.1.0"


def test_the_package_is_typed():
    import importlib.resources

    files = importlib.resources.files("kvgate")
    assert (files / "py.typed").is_file() and (files / "_kvgate.pyi").is_file()
