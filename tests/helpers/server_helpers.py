"""Shared pieces of the server tests: a deterministic content-driven policy, a small index, a live uvicorn on a real
socket, and a Server-Sent Events parser."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from routerag.prompts import chatml
from routerag.policy.types import Generation, GenerationRequest

FIX = Path(__file__).resolve().parents[1] / "fixtures"
_QUESTION = re.compile(r"Question: (.*?)\n?<\|im_end\|>", re.DOTALL)
_FIRST_DOC = re.compile(r"<information>Doc 1 \(Title: (.*?)\) ")


class RoutingPolicy:
    """A policy whose every reply depends only on its own request, never on call order (unlike
    :class:`tests.helpers.scripted.ScriptedGenerator`, which pops turns globally), so any number of concurrent requests is
    deterministic: first it searches the question in ``mode_tag``'s mode, then it answers with the title of the
    first document it got back; a forced answer is ``unknown``. ``delay_s`` makes every generation that slow;
    ``serial`` makes generations run one at a time, as on a model with a fixed throughput (an in-process model on a
    CPU), so that concurrent requests slow each other down. A question that contains ``refuse_on`` is refused after
    its search (``<answer>[refuse]``), as the policy refuses documents that do not answer."""

    name = "routing-policy"
    tracks_tokens = False
    tokenizer = None

    def __init__(self, mode_tag: str = "[graph]", delay_s: float = 0.0, serial: bool = False,
                 refuse_on: str | None = None) -> None:
        self.mode_tag = mode_tag
        self.refuse_on = refuse_on
        self.delay_s = delay_s
        self.serial = serial
        self.calls = 0
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def render_prompt(self, user_message: str) -> tuple[str, None]:
        return chatml(user_message), None

    async def generate(self, request: GenerationRequest) -> Generation:
        self.calls += 1
        if self.serial:
            async with self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock()):
                await asyncio.sleep(self.delay_s)
        elif self.delay_s:
            await asyncio.sleep(self.delay_s)
        prompt = request.prompt_text
        if request.stop == ("</answer>",):  # forced: the <answer> tag is already open in the prompt
            text = "unknown"
        elif (doc := _FIRST_DOC.search(prompt)) is None:  # (the instruction itself mentions <information>)
            m = _QUESTION.search(prompt)
            question = " ".join(m.group(1).split()) if m else "question"
            text = f"<think>I should look this up.</think>\n<search>{self.mode_tag} {question}"
        elif self.refuse_on and self.refuse_on in ((m := _QUESTION.search(prompt)) and m.group(1) or ""):
            text = "<think>None of these says it.</think>\n<answer>[refuse]"
        else:
            text = f"<think>The first document answers it.</think>\n<answer>{doc.group(1)}"
        # as a completions server: the stop string that fired is cut off
        return Generation(text=text, finish_reason="stop", prompt_tokens=len(prompt.split()),
                          completion_tokens=len(text.split()))


def build_small_index(out: Path, minilm: Any, spacy_extractor: Any) -> Path:
    """The two-hop fixture corpus (10 passages) as an index, with the session's models."""
    from graph_index.builder import Components, build_index
    from routerag.config import Settings

    cfg = Settings(cache_dir=out.parent / "cache")
    build_index([FIX / "twohop.jsonl"], out, cfg, progress=False,
                components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    return out


@contextmanager
def live_server(app: Any, host: str = "127.0.0.1", lifespan: str = "off") -> Iterator[str]:
    """Run ``app`` under uvicorn on a free port in a thread; yields its base URL. ``lifespan="on"`` for apps that
    start work in their lifespan (the MCP SDK's session manager)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan,
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """``(event, data)`` pairs of a Server-Sent Events body (data parsed as JSON; comments such as pings skipped)."""
    out: list[tuple[str, Any]] = []
    for block in re.split(r"\r?\n\r?\n", text):
        event, data = "message", []
        for line in block.splitlines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((event, json.loads("\n".join(data))))
    return out


def wait_until_ready(proc: Any, url: str, log: Path, timeout_s: float = 120) -> None:
    """Poll ``url``/ready until the server process answers 200; fail with its log if it exits or takes too long."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
