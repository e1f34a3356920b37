"""KV events in vLLM's format: field names and order as vLLM declares them (a list transcribed from vLLM's
source, its commit named in the file), and a router-style consumer that rebuilds the engine's cached blocks
from the event stream alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvgate

VLLM = json.loads((Path(__file__).parent / "vllm_kv_events.json").read_text(encoding="utf-8"))
BLOCK = 16


def tokens(agent, turn, n):
    return [(agent * 7919 + turn * 104729 + i * 31) % 50_000 for i in range(n)]


class Router:
    """What a KV-aware router keeps per engine: the set of block hashes the events say are cached."""

    def __init__(self):
        self.blocks = set()

    def apply(self, event):
        kind = event["type"]
        if kind == "BlockStored":
            assert len(event["token_ids"]) == event["block_size"] * len(event["block_hashes"])
            for block_hash in event["block_hashes"]:
                assert isinstance(block_hash, bytes) and len(block_hash) == 32
                assert block_hash not in self.blocks, "stored twice"
                self.blocks.add(block_hash)
        elif kind == "BlockRemoved":
            for block_hash in event["block_hashes"]:
                self.blocks.remove(block_hash)  # KeyError: removed, never stored
        else:
            assert kind == "AllBlocksCleared"
            self.blocks.clear()


def sessions(engine, router, agents=4, turns=4, new=40):
    """Multi-turn sessions on a pool they outgrow; every step's events go to `router`, which must agree with
    the engine after every step. Returns every event."""
    seen = []
    contexts = [tokens(a, 0, 100) for a in range(agents)]
    next_id = 1
    for turn in range(turns):
        for context in contexts:
            engine.submit(next_id, context, 8, is_later_turn=turn > 0)
            next_id += 1
        while not engine.is_idle():
            engine.step()
            batch = engine.take_kv_event_batch()
            for event in batch["events"]:
                router.apply(event)
            seen.extend(batch["events"])
            assert router.blocks == set(engine.cached_block_hashes())
        done = sorted(engine.take_finished(), key=lambda d: d["id"])
        for agent, (context, finished) in enumerate(zip(contexts, done)):
            context.extend(finished["output"])
            context.extend(tokens(agent, turn + 1, new))
    return seen


@pytest.mark.parametrize("policy", ["ordinary", "pages-only", "reserved"])
def test_a_router_rebuilds_the_engines_cached_blocks_from_the_events(policy):
    engine = kvgate.Engine({"pool": {"pages": 48}}, policy=policy, kv_events=True)
    router = Router()
    seen = sessions(engine, router)
    kinds = {event["type"] for event in seen}
    assert kinds == {"BlockStored", "BlockRemoved"}, kinds
    assert router.blocks and router.blocks == set(engine.cached_block_hashes())
    engine.reset_prefix_cache(force=True)
    events = engine.take_kv_events()
    assert events[-1] == {"type": "AllBlocksCleared"}
    for event in events:
        router.apply(event)
    assert router.blocks == set() == set(engine.cached_block_hashes())
    assert engine.kv_events_dropped == 0


def test_events_carry_vllms_fields_in_vllms_order():
    engine = kvgate.Engine({"pool": {"pages": 48}}, kv_events=True)
    seen = sessions(engine, Router())
    engine.reset_prefix_cache(force=True)
    seen += engine.take_kv_events()
    by_kind = {}
    for event in seen:
        by_kind.setdefault(event["type"], event)
        assert list(event) == [VLLM["tag_field"], *VLLM[event["type"]]], event["type"]
    assert set(by_kind) == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    stored = by_kind["BlockStored"]
    assert stored["parent_block_hash"] is None and stored["block_size"] == BLOCK
    assert stored["medium"] == "GPU" and stored["group_idx"] == 0
    assert stored["kv_cache_spec_kind"] == "full_attention"
    assert stored["token_ids"][:BLOCK] == tokens(0, 0, BLOCK)
    chained = [e for e in seen if e["type"] == "BlockStored" and e["parent_block_hash"] is not None]
    assert chained, "no event continues a chain"
    batch = engine.take_kv_event_batch(data_parallel_rank=2)
    assert list(batch) == VLLM["KVEventBatch"]
    assert batch["events"] == [] and batch["data_parallel_rank"] == 2 and batch["ts"] == engine.now_s


def test_events_are_off_by_default():
    engine = kvgate.Engine({"pool": {"pages": 48}})
    engine.submit(1, tokens(0, 0, 64), 2)
    while not engine.is_idle():
        engine.step()
    assert engine.cached_block_hashes() and engine.take_kv_events() == []


def test_a_full_log_drops_its_oldest_events_and_counts_them():
    engine = kvgate.Engine({"pool": {"pages": 256}}, kv_events=2)
    for request in range(1, 4):
        engine.submit(request, tokens(request, 0, 64), 2)
        while not engine.is_idle():
            engine.step()
    assert len(engine.take_kv_events()) == 2 and engine.kv_events_dropped == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [("yes", TypeError), (1.5, TypeError), (0, ValueError), (-1, ValueError), (2**40, ValueError)],
)
def test_bad_kv_event_capacities_are_refused(value, error):
    with pytest.raises(error, match="kv_events"):
        kvgate.Engine(kv_events=value)


def test_a_bad_data_parallel_rank_is_refused():
    engine = kvgate.Engine(kv_events=True)
    with pytest.raises(TypeError, match="data_parallel_rank"):
        engine.take_kv_event_batch(data_parallel_rank="0")
    with pytest.raises(ValueError, match="data_parallel_rank"):
        engine.take_kv_event_batch(data_parallel_rank=-1)
