"""Shared fixtures: the repository's paths and the `kvgate` command-line binary the reports are compared with."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, List

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "tests" / "scenarios"


def _binary() -> Any:
    """The `kvgate` binary: $KVGATE_BIN, else target/release or target/debug; None when there is none."""
    candidates = [os.environ.get("KVGATE_BIN", "")]
    candidates += [str(ROOT / "target" / profile / "kvgate") for profile in ("release", "debug")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None), candidates


def _generated_trace() -> Path:
    """A Mooncake-format trace of 200 requests the binary generates (`kvgate trace generate`, seeded)."""
    path = Path(tempfile.mkdtemp(prefix="kvgate-py-tests-")) / "trace.jsonl"
    binary, _ = _binary()
    if binary is not None:
        with open(path, "w", encoding="utf-8") as out:
            args = ["trace", "generate", "--seed", "0", "--requests", "200", "--rate", "4"]
            subprocess.run([binary, *args], stdout=out, check=True, timeout=120)
    return path


TRACE = _generated_trace()


@pytest.fixture(scope="session")
def cli() -> Any:
    """Runs the `kvgate` binary ($KVGATE_BIN, else target/release or target/debug) and parses its JSON."""
    binary, candidates = _binary()
    if binary is None:
        pytest.fail(
            "no kvgate binary: build it (cargo build -p kvgate) or set KVGATE_BIN; "
            f"looked at {candidates}"
        )

    def run(args: List[str]) -> Any:
        done = subprocess.run(
            [binary, *args], capture_output=True, text=True, check=False, timeout=600
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return run


def without_wall_time(value: Any) -> Any:
    """`value` without its wall-clock fields, the only ones two identical runs may differ in."""
    if isinstance(value, dict):
        return {k: without_wall_time(v) for k, v in value.items() if k != "wall_seconds"}
    if isinstance(value, list):
        return [without_wall_time(v) for v in value]
    return value
