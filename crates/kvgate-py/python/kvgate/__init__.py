"""kvgate from Python: the KV-cache restore-admission simulator and engine, on kvgate's Rust core.

Runs (``agents``, ``replay``, ``scenario``) take the command line's options, with its defaults, and return
the report ``kvgate ... --json`` prints, as plain dicts and lists (``pandas.DataFrame(report["runs"])``
gives one row per policy). Long runs release the GIL, report progress through ``progress(policy, done,
total)`` and stop at the next engine step on Ctrl-C, raising ``KeyboardInterrupt``. ``Engine`` is one
engine driven step by step, as a scheduler drives it. Errors are ``kvgate.errors`` classes (or
``TypeError``/``ValueError`` for arguments of the wrong type or range, ``FileNotFoundError`` for a missing
file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from . import _kvgate
from .errors import (
    ImpossibleError,
    InternalError,
    InvalidError,
    KvgateError,
    PressureError,
)

__all__ = [
    "Engine",
    "ImpossibleError",
    "InternalError",
    "InvalidError",
    "KvgateError",
    "PressureError",
    "KV_EVENTS_CAPACITY",
    "POLICIES",
    "agents",
    "replay",
    "scenario",
]

__version__: str = _kvgate.__version__

#: The admission policies, in the order the command line runs them.
POLICIES = ("ordinary", "pages-only", "reserved", "oracle")

#: KV events an engine keeps by default (``Engine(kv_events=True)``); beyond it the oldest are dropped.
KV_EVENTS_CAPACITY = 65_536

PathLike = Union[str, "os.PathLike[str]"]
Config = Union[PathLike, Mapping[str, Any], None]
Progress = Optional[Callable[[str, int, int], Any]]

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def _int(name: str, value: Any, low: int = 0, high: int = _U32_MAX) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} = {value} is out of range: allowed {low} to {high}")
    return value


def _float(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return float(value)


def _str(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _path(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), not {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a text path, not bytes")
    return path


def _policies(value: Union[str, Iterable[str], None]) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [name.strip() for name in value.split(",")]
    try:
        names = list(value)
    except TypeError:
        raise TypeError(
            f"policies must be a str or a list of str, not {type(value).__name__}"
        ) from None
    for name in names:
        _str("policies[...]", name)
    return names


def _config(value: Config) -> Dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {"config_table": dict(value)}
    return {"config_file": _path("config", value)}


def _progress(value: Progress) -> Progress:
    if value is not None and not callable(value):
        raise TypeError(f"progress must be callable, not {type(value).__name__}")
    return value


def _run_options(
    config: Config,
    pool_pages: Optional[int],
    store_pages: Optional[int],
    preset: Optional[str],
    seed: Optional[int],
    preemption: Optional[str],
    storage: Optional[str],
    copy_engine: Optional[str],
    policies: Union[str, Iterable[str], None],
    verify: bool,
    series: bool,
) -> Dict[str, Any]:
    options = _config(config)
    options.update(
        pool_pages=_int("pool_pages", pool_pages),
        store_pages=_int("store_pages", store_pages, high=_U64_MAX),
        preset=_str("preset", preset),
        seed=_int("seed", seed, high=_U64_MAX),
        preemption=_str("preemption", preemption),
        storage=_str("storage", storage),
        copy_engine=_str("copy_engine", copy_engine),
        policies=_policies(policies),
        verify=_bool("verify", verify),
        series=_bool("series", series),
    )
    return options


def agents(
    *,
    agents: Optional[int] = None,
    turns: Optional[int] = None,
    think_s: Optional[float] = None,
    turn_priority: str = "arrival",
    executor: str = "sim",
    policies: Union[str, Iterable[str], None] = None,
    config: Config = None,
    pool_pages: Optional[int] = None,
    store_pages: Optional[int] = None,
    preset: Optional[str] = None,
    seed: Optional[int] = None,
    preemption: Optional[str] = None,
    storage: Optional[str] = None,
    copy_engine: Optional[str] = None,
    verify: bool = False,
    series: bool = False,
    progress: Progress = None,
) -> Dict[str, Any]:
    """Agent sessions whose contexts outgrow the pool, under each policy (``kvgate agents --json``).

    Defaults are the command line's: 8 sessions of 32 turns, 2 s think time, every policy, a pool of
    16 384 tokens per rank (192 pages with ``executor="reference"``, a live run). ``series=True`` adds each
    run's ``series``: per-step columns (``steps``: time, free and credit pages, waiting, running, ...) and
    per-request columns (``requests``: session, turn, tokens from cache, time to first token, turn time).
    """
    options = _run_options(
        config, pool_pages, store_pages, preset, seed, preemption, storage, copy_engine,
        policies, verify, series,
    )
    options.update(
        agents=_int("agents", agents),
        turns=_int("turns", turns),
        think_s=_float("think_s", think_s),
        turn_priority=_str("turn_priority", turn_priority),
        executor=_str("executor", executor),
    )
    return _kvgate.agents(options, _progress(progress))


def replay(
    trace: PathLike,
    *,
    limit: Optional[int] = None,
    time_scale: float = 1.0,
    engines: int = 1,
    router: str = "cache-aware",
    policies: Union[str, Iterable[str], None] = None,
    config: Config = None,
    pool_pages: Optional[int] = None,
    store_pages: Optional[int] = None,
    preset: Optional[str] = None,
    seed: Optional[int] = None,
    preemption: Optional[str] = None,
    storage: Optional[str] = None,
    copy_engine: Optional[str] = None,
    verify: bool = False,
    series: bool = False,
    progress: Progress = None,
) -> Dict[str, Any]:
    """A Mooncake-format JSONL trace replayed by its timestamps (``kvgate replay TRACE --json``).

    ``engines > 1`` replays it on a cluster sharing one checkpoint store, requests routed by ``router``
    (round-robin, least-loaded, cache-aware); its report has each engine's metrics and ``keep_up``.
    ``series=True`` (one engine only) adds each run's per-step and per-request columns.
    """
    options = _run_options(
        config, pool_pages, store_pages, preset, seed, preemption, storage, copy_engine,
        policies, verify, series,
    )
    options.update(
        limit=_int("limit", limit, high=_U64_MAX),
        time_scale=_float("time_scale", time_scale),
        engines=_int("engines", engines),
        router=_str("router", router),
    )
    return _kvgate.replay(_path("trace", trace), options, _progress(progress))


def scenario(file: PathLike, *, preset: Optional[str] = None) -> Dict[str, Any]:
    """A scripted timeline's per-step trace (``kvgate scenario FILE``): description, policy, steps, metrics."""
    return _kvgate.scenario(_path("file", file), _str("preset", preset))


class Engine:
    """One engine, driven as a scheduler drives it: ``submit``, then ``step`` until ``is_idle()``.

    ``config`` is a dict of the TOML tables (``{"pool": {"pages": 512}}``), a path to a TOML file, or
    ``None`` for the defaults; ``toml`` gives TOML text instead. Every report is a dict.

    ``kv_events=True`` (or a capacity) has the engine emit KV events in vLLM's format as its prefix cache
    changes (``take_kv_events``), keeping at most that many (``KV_EVENTS_CAPACITY`` for ``True``), the
    oldest dropped first and counted (``kv_events_dropped``).
    """

    def __init__(
        self,
        config: Config = None,
        *,
        toml: Optional[str] = None,
        policy: str = "reserved",
        seed: Optional[int] = None,
        kv_events: Union[bool, int] = False,
    ) -> None:
        options = _config(config)
        if toml is not None:
            if options:
                raise TypeError("give config or toml, not both")
            options["toml"] = _str("toml", toml)
        options.update(policy=_str("policy", policy), seed=_int("seed", seed, high=_U64_MAX))
        if kv_events is True:
            options["kv_events"] = KV_EVENTS_CAPACITY
        elif kv_events is not False:
            options["kv_events"] = _int("kv_events", kv_events, low=1, high=_U32_MAX)
        self._engine = _kvgate.Engine(options)

    def submit(
        self,
        id: int,
        prompt: Iterable[int],
        max_output_tokens: int,
        *,
        arrival_s: Optional[float] = None,
        priority: int = 0,
        is_later_turn: bool = False,
    ) -> None:
        """Submits request ``id`` with ``prompt`` token ids, arriving at ``arrival_s`` (default: now)."""
        if isinstance(prompt, (str, bytes)):
            raise TypeError("prompt must be a list of token ids, not a string")
        tokens = [_int("prompt[...]", token) for token in prompt]
        self._engine.submit(
            _int("id", id, high=_U64_MAX),
            tokens,
            _int("max_output_tokens", max_output_tokens),
            _float("arrival_s", arrival_s),
            _int("priority", priority, _I32_MIN, _I32_MAX),
            _bool("is_later_turn", is_later_turn),
        )

    def submit_trace_record(
        self,
        id: int,
        record: Mapping[str, Any],
        *,
        arrival_s: Optional[float] = None,
        is_later_turn: bool = False,
    ) -> None:
        """Submits a Mooncake trace record (timestamp, input_length, output_length, hash_ids) as ``id``."""
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a dict, not {type(record).__name__}")
        self._engine.submit_trace_record(
            _int("id", id, high=_U64_MAX),
            dict(record),
            _float("arrival_s", arrival_s),
            _bool("is_later_turn", is_later_turn),
        )

    def step(self) -> Dict[str, Any]:
        """Runs one engine step; its report (prefills, decodes, admitted, finished, pages, ...)."""
        return self._engine.step()

    def cancel(self, id: int) -> None:
        """Cancels live request ``id``."""
        self._engine.cancel(_int("id", id, high=_U64_MAX))

    def shutdown(self) -> Dict[str, Any]:
        """Cancels every live request and drains copies in flight."""
        return self._engine.shutdown()

    def request(self, id: int) -> Optional[Dict[str, Any]]:
        """The view of live request ``id`` (phase, pages, tokens computed), or ``None``."""
        return self._engine.request(_int("id", id, high=_U64_MAX))

    def take_finished(self) -> List[Dict[str, Any]]:
        """Requests finished or cancelled since the last call: id, output, cancelled, metrics."""
        return self._engine.take_finished()

    def metrics(self) -> Dict[str, Any]:
        """The run's metrics so far, named as in ``kvgate agents --json``."""
        return self._engine.metrics()

    def request_metrics(self) -> List[Dict[str, Any]]:
        """Every finished or cancelled request's metrics, in completion order."""
        return self._engine.request_metrics()

    def reset_prefix_cache(self, force: bool = False) -> None:
        """Drops every cached prefix block; a ``PressureError`` while pages are in use, unless ``force``."""
        self._engine.reset_prefix_cache(_bool("force", force))

    def is_idle(self) -> bool:
        """Whether no request is live."""
        return self._engine.is_idle()

    @property
    def now_s(self) -> float:
        """Engine time in seconds."""
        return self._engine.now_s

    @property
    def n_live_requests(self) -> int:
        """Requests submitted and not yet finished."""
        return self._engine.n_live_requests

    @property
    def policy(self) -> str:
        """The admission policy."""
        return self._engine.policy

    def take_kv_events(self) -> List[Dict[str, Any]]:
        """The KV events since the last call, oldest first, as vLLM's ``BlockStored``, ``BlockRemoved`` and
        ``AllBlocksCleared``: dicts of vLLM's fields after a ``type`` tag naming the event, block hashes as
        ``bytes`` (32 bytes of the block's BLAKE3 chain key). Empty unless built with ``kv_events``."""
        return self._engine.take_kv_events()

    def take_kv_event_batch(self, data_parallel_rank: Optional[int] = None) -> Dict[str, Any]:
        """``take_kv_events`` in vLLM's ``KVEventBatch`` envelope: ``ts`` (engine time, seconds),
        ``events``, ``data_parallel_rank``."""
        rank = _int("data_parallel_rank", data_parallel_rank)
        return {"ts": self.now_s, "events": self.take_kv_events(), "data_parallel_rank": rank}

    @property
    def kv_events_dropped(self) -> int:
        """KV events dropped because the log was full: a consumer that sees this grow must resync."""
        return self._engine.kv_events_dropped

    def cached_block_hashes(self) -> List[bytes]:
        """The hashes of every block in the prefix cache now (what a consumer of every event holds)."""
        return self._engine.cached_block_hashes()
