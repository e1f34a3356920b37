"""Bad arguments of every kind raise TypeError, ValueError or a kvgate error with a clear message."""

from __future__ import annotations

import math

import pytest

import kvgate
from conftest import SCENARIOS, TRACE

NAN = float("nan")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(agents="8"), TypeError, "agents must be an int, not str"),
        (dict(agents=2.5), TypeError, "agents must be an int, not float"),
        (dict(agents=True), TypeError, "agents must be an int, not bool"),
        (dict(agents=-1), ValueError, "agents = -1 is out of range"),
        (dict(agents=2**40), ValueError, "is out of range"),
        (dict(agents=0), kvgate.InvalidError, "agents"),
        (dict(agents=100_001), kvgate.InvalidError, "agents"),
        (dict(turns=-3), ValueError, "turns = -3 is out of range"),
        (dict(agents=1000, turns=1000), kvgate.InvalidError, "turns"),
        (dict(think_s=NAN), kvgate.InvalidError, "NaN"),
        (dict(think_s=-1.0), kvgate.InvalidError, "think"),
        (dict(think_s=math.inf), kvgate.InvalidError, "think"),
        (dict(think_s="2"), TypeError, "think_s must be a number, not str"),
        (dict(pool_pages=0), kvgate.InvalidError, "pages"),
        (dict(pool_pages=-5), ValueError, "pool_pages = -5 is out of range"),
        (dict(pool_pages=2**32), ValueError, "pool_pages"),
        (dict(store_pages=-1), ValueError, "store_pages"),
        (dict(seed=-1), ValueError, "seed = -1 is out of range"),
        (dict(seed=2**64), ValueError, "seed"),
        (dict(policies="bogus"), kvgate.InvalidError, "unknown policy \"bogus\""),
        (dict(policies=5), TypeError, "policies must be a str or a list of str"),
        (dict(policies=[1]), TypeError, "must be a str"),
        (dict(preset="no-such-preset"), kvgate.InvalidError, "no-such-preset"),
        (dict(preemption="sometimes"), kvgate.InvalidError, "preemption"),
        (dict(storage="tape"), kvgate.InvalidError, "storage"),
        (dict(copy_engine="warp"), kvgate.InvalidError, "copy_engine"),
        (dict(turn_priority="random"), kvgate.InvalidError, "arrival or progress"),
        (dict(executor="gpu"), kvgate.InvalidError, "sim or reference"),
        (dict(verify="yes"), TypeError, "verify must be a bool"),
        (dict(series=1), TypeError, "series must be a bool"),
        (dict(progress=5), TypeError, "progress must be callable"),
        (dict(config=3), TypeError, "config must be a path"),
        (dict(config={"pool": {"pages": "many"}}), kvgate.InvalidError, "pages"),
        (dict(config={"pool": {"pages": -1}}), kvgate.InvalidError, "pages"),
        (dict(config={"pool": {"pages": 2**70}}), TypeError, "does not fit in 64 bits"),
        (dict(config={"nonsense": {"x": 1}}), kvgate.InvalidError, "nonsense"),
        (dict(config={"pool": {"pages": None}}), TypeError, "leave the field out"),
        (dict(config={"pool": {"pages": NAN}}), TypeError, "not a finite number"),
        (dict(config={"pool": object()}), TypeError, "cannot be part of a config"),
        (dict(config={1: {}}), TypeError, "keys must be strings"),
        (dict(config="/no/such/config.toml"), FileNotFoundError, "/no/such/config.toml"),
    ],
)
def test_agents_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error) as raised:
        kvgate.agents(**kwargs)
    assert message in str(raised.value)


def test_an_invalid_error_is_also_a_value_error_and_a_kvgate_error():
    with pytest.raises(ValueError):
        kvgate.agents(agents=0)
    with pytest.raises(kvgate.KvgateError):
        kvgate.agents(agents=0)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(time_scale=NAN), kvgate.InvalidError, "--time-scale NaN is invalid"),
        (dict(time_scale=-1.0), kvgate.InvalidError, "--time-scale"),
        (dict(time_scale=0), kvgate.InvalidError, "--time-scale"),
        (dict(time_scale=1e300), kvgate.InvalidError, "--time-scale"),
        (dict(time_scale="fast"), TypeError, "time_scale must be a number"),
        (dict(limit=0), kvgate.InvalidError, "--limit 0 is invalid"),
        (dict(limit=-1), ValueError, "limit = -1 is out of range"),
        (dict(engines=0), kvgate.InvalidError, "engines"),
        (dict(engines=65), kvgate.InvalidError, "engines"),
        (dict(engines=2.0), TypeError, "engines must be an int"),
        (dict(router="random"), kvgate.InvalidError, "random"),
        (dict(engines=2, series=True), kvgate.InvalidError, "series"),
    ],
)
def test_replay_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error) as raised:
        kvgate.replay(TRACE, **kwargs)
    assert message in str(raised.value)


def test_replay_of_a_missing_trace_is_file_not_found():
    with pytest.raises(FileNotFoundError, match="no-such-trace.jsonl"):
        kvgate.replay("/tmp/no-such-trace.jsonl")


def test_replay_of_a_malformed_trace_names_the_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\nnot json\n')
    with pytest.raises(kvgate.InvalidError, match="bad.jsonl:2: "):
        kvgate.replay(trace)


def test_replay_refuses_a_trace_that_is_not_a_path():
    with pytest.raises(TypeError, match="trace must be a path"):
        kvgate.replay(42)


def test_scenario_refuses_a_missing_or_malformed_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        kvgate.scenario(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{]")
    with pytest.raises(kvgate.InvalidError, match="bad.json"):
        kvgate.scenario(bad)
    with pytest.raises(kvgate.InvalidError, match="nope"):
        kvgate.scenario(SCENARIOS / "capacity_wait.json", preset="nope")
    with pytest.raises(TypeError):
        kvgate.scenario(None)
