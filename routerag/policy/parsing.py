"""Reading one turn of policy output: the thought, then a search (with its retrieval mode), an answer or a refusal.

RouteRAG's rules: the first complete ``<search>…</search>`` or ``<answer>…</answer>`` is the action; ``[passage]``
selects dense retrieval, ``[graph]`` the graph, both select the fused hybrid, neither defaults to passage. An answer
that begins with :data:`~routerag.prompts.REFUSE_MARKER` (``<answer> [refuse] </answer>``) is a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..prompts import REFUSE_MARKER
from ..vocabulary import Mode

STOP_STRINGS = ("</search>", "</answer>")

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_MODE_TAG = re.compile(r"\[(passage|graph)\]", re.IGNORECASE)
_REFUSAL = re.compile(rf"\s*{re.escape(REFUSE_MARKER)}", re.IGNORECASE)

ActionKind = Literal["search", "answer", "refuse", "invalid"]


@dataclass(slots=True, frozen=True)
class Action:
    kind: ActionKind
    thought: str
    content: str = ""
    """The answer text (a refusal's too, marker included), or the query text without mode tags."""
    mode: Mode | None = None
    mode_tags: tuple[str, ...] = ()
    """Which tags the policy wrote (empty: it named no mode, and passage was used)."""


def parse_turn(text: str) -> Action:
    """The action of one generated turn (``invalid`` when it holds no complete tag pair or an empty query; ``refuse``
    for an answer that is a refusal)."""
    m = _ACTION.search(text)
    think = _THINK.search(text[: m.start()] if m else text)
    thought = think.group(1).strip() if think else ""
    if m is None:
        return Action("invalid", thought)
    kind, body = m.group(1).lower(), m.group(2)
    if kind == "answer":
        answer = " ".join(body.split())
        return Action("refuse" if is_refusal(answer) else "answer", thought, answer)
    tags = tuple(dict.fromkeys(t.lower() for t in _MODE_TAG.findall(body)))
    query = " ".join(_MODE_TAG.sub(" ", body).split())
    if not query:
        return Action("invalid", thought)
    return Action("search", thought, query, mode_from_tags(tags), tags)


def is_refusal(answer: str | None) -> bool:
    """Whether an answer's text is the refusal convention: it begins with the marker (what follows is ignored, so a
    policy that adds a reason still refuses)."""
    return bool(answer and _REFUSAL.match(answer))


def mode_from_tags(tags: tuple[str, ...]) -> Mode:
    has_p, has_g = "passage" in tags, "graph" in tags
    if has_p and has_g:
        return "hybrid"
    return "graph" if has_g else "passage"


def close_stop(text: str) -> str:
    """Completion servers cut the stop string off; put the closing tag back so the context stays well formed."""
    last_open = max((text.lower().rfind(f"<{t}>"), t) for t in ("search", "answer"))
    pos, tag = last_open
    if pos >= 0 and f"</{tag}>" not in text.lower()[pos:]:
        return text + f"</{tag}>"
    return text
