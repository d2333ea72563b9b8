"""HippoRAG 2's recognition memory: a language model reads the facts matched to a query and keeps only those that
help answer it, so a fact that is merely similar in wording does not seed the PageRank.

Any OpenAI-compatible chat endpoint serves (vLLM, OpenAI, llama.cpp). A batch of queries is sent concurrently. A
failed or unreadable answer keeps every candidate: the filter may only ever sharpen retrieval, never break it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..prompts import FACT_FILTER_SYSTEM, fact_filter_question

log = logging.getLogger(__name__)

Fact = tuple[str, str, str]


def build_messages(query: str, facts: Sequence[Fact]) -> list[dict[str, str]]:
    return [{"role": "system", "content": FACT_FILTER_SYSTEM},
            {"role": "user", "content": fact_filter_question(query, facts)}]


def parse_keep(text: str, n: int) -> list[int] | None:
    """0-based indices of the kept facts in the model's order, or None when the answer cannot be read."""
    match = re.search(r"\{.*\}", text, flags=re.S)
    if match is None:
        return None
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    keep = data.get("keep") if isinstance(data, dict) else None
    if not isinstance(keep, list):
        return None
    out: list[int] = []
    for item in keep:
        if isinstance(item, bool) or not isinstance(item, int | str):
            continue
        try:
            i = int(item) - 1
        except ValueError:
            continue
        if 0 <= i < n and i not in out:
            out.append(i)
    return out


class LLMFactFilter:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 30.0,
                 max_concurrency: int = 8, max_tokens: int = 64) -> None:
        from graph_index.llm_clients import Endpoint, openai_client

        self.client = openai_client(Endpoint(base_url, api_key, timeout_s=timeout_s), max_retries=2)
        self.model = model
        self.max_concurrency = max_concurrency
        self.max_tokens = max_tokens
        self.answered = 0
        """Requests the server answered with a completion (read or not): what tells a live endpoint from a dead one,
        since every failure keeps all candidates."""
        self._count_lock = threading.Lock()

    def keep(self, queries: Sequence[str], candidates: Sequence[Sequence[Fact]]) -> list[list[int] | None]:
        """Per query, the indices of the candidates to keep (the model's order), or None where the model failed —
        the caller then keeps them all."""
        if len(queries) != len(candidates):
            raise ValueError("one candidate list per query")
        jobs = [(q, c) for q, c in zip(queries, candidates)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs)))) as pool:
            return list(pool.map(lambda job: self._one(*job), jobs))

    def _one(self, query: str, facts: Sequence[Fact]) -> list[int] | None:
        if not facts:
            return []
        import openai

        try:
            resp = self.client.chat.completions.create(model=self.model, messages=build_messages(query, facts),
                                                       temperature=0.0, max_tokens=self.max_tokens)
        except openai.OpenAIError as exc:
            log.warning("fact filter request failed (%s); keeping all %d facts", exc, len(facts))
            return None
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            log.warning("fact filter server answered without a completion; keeping all %d facts", len(facts))
            return None
        with self._count_lock:
            self.answered += 1
        text = getattr(getattr(choices[0], "message", None), "content", None) or ""
        kept = parse_keep(text, len(facts))
        if kept is None:
            log.warning("fact filter answer unreadable (%r); keeping all %d facts", text[:200], len(facts))
        return kept
