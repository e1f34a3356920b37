"""`kvgate serve` driven by the official `openai` Python package: a multi-turn streamed chat whose later
turns are served from cache (`usage.prompt_tokens_details.cached_tokens` grows), a plain completion, and
the client's own exceptions for refused requests. The fixture starts the binary (`KVGATE_BIN`, default
target/debug/kvgate) on a free port and stops it with SIGTERM, which must exit 0 with no leaked pages."""

import os
import pathlib
import signal
import subprocess

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    binary = os.environ.get("KVGATE_BIN", str(ROOT / "target" / "debug" / "kvgate"))
    proc = subprocess.Popen(
        [binary, "serve", "--addr", "127.0.0.1:0", "--shutdown-grace-s", "5"],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for _ in range(100):
        line = proc.stderr.readline()
        lines.append(line)
        if "serving" in line or not line:
            break
    assert "http://" in line, f"kvgate serve did not start: {lines!r}"
    base = line.strip().rsplit("http://", 1)[1]
    yield f"http://{base}/v1"
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, rest
    assert "0 leaked pages" in rest, rest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0)


def streamed_turn(client, messages):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert usage is not None, "the stream carried no usage"
    assert finish == "length"
    assert usage.completion_tokens == 16
    return text, usage


def test_multi_turn_streamed_chat_is_served_from_cache(client):
    messages = [{"role": "system", "content": "You are a careful assistant. " * 20}]
    cached = []
    for turn in range(4):
        messages.append({"role": "user", "content": f"Turn {turn}: " + "tell me more about caches. " * 8})
        text, usage = streamed_turn(client, messages)
        assert usage.prompt_tokens > 0
        cached.append(usage.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": text})
    print("cached_tokens per turn:", cached)
    assert cached[0] == 0, cached
    for earlier, later in zip(cached, cached[1:]):
        assert later > earlier, f"cached_tokens did not grow turn over turn: {cached}"


def test_plain_completion(client):
    answer = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert isinstance(answer.choices[0].text, str)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 8
    assert answer.usage.prompt_tokens > 0


def test_models_lists_the_model_and_its_executor(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_refusals_raise_the_clients_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"
