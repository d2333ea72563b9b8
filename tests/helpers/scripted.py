"""A scripted policy for tests: it replays given turns, so the loop's every branch can be driven exactly."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from routerag.prompts import chatml
from routerag.policy.types import Generation, GenerationRequest
from routerag.retrieval.types import RetrievalResult, RetrievedDoc
from routerag.vocabulary import Mode


class ScriptedGenerator:
    """Returns the next scripted turn for each call. A turn is the text the model "writes" (the stop string is cut,
    as a completions server does) or a callable that gets the request. With ``tokenizer``, it works on tokens."""

    name = "scripted"

    def __init__(self, turns: Sequence[str | Callable[[GenerationRequest], str]], tokenizer=None) -> None:
        self.turns = list(turns)
        self.tokenizer = tokenizer
        self.tracks_tokens = tokenizer is not None
        self.requests: list[GenerationRequest] = []

    def render_prompt(self, user_message: str):
        text = chatml(user_message)
        ids = self.tokenizer.encode(text, add_special_tokens=False) if self.tokenizer is not None else None
        return text, ids

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        if not self.turns:
            raise AssertionError("the script ran out of turns")
        turn = self.turns.pop(0)
        text = turn(request) if callable(turn) else turn
        fired = [s for s in request.stop if s in text]
        finish = "length" if text.endswith("…") else ("stop" if fired else "eos")
        if self.tokenizer is None:
            for stop in fired:  # a completions server returns the text before the stop string
                text = text[: text.index(stop)] if stop in text else text
            return Generation(text=text, finish_reason=finish)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Generation(text=text, token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=finish,
                          prompt_tokens=len(request.prompt_ids or []), completion_tokens=len(ids))


class FakeSearch:
    """Records searches and returns canned documents (one per title)."""

    def __init__(self, docs: dict[str, list[str]] | None = None, ms: float = 3.0) -> None:
        self.docs = docs or {}
        self.calls: list[tuple[str, Mode, int]] = []
        self.ms = ms

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        self.calls.append((query, mode, k))
        titles = self.docs.get(query, [f"{query} page {i}" for i in range(k)])[:k]
        docs = [RetrievedDoc(f"id-{t}", t, f"Text about {t}.", 1.0 / (i + 1)) for i, t in enumerate(titles)]
        return RetrievalResult(query, mode, docs, {"dense": self.ms})


class PagesSearch:
    """Canned pages by query (title, text), recording each search; a query it has no pages for returns none."""

    def __init__(self, pages: dict[str, list[tuple[str, str]]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, Mode, int]] = []

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        self.calls.append((query, mode, k))
        docs = [RetrievedDoc(f"id-{t}", t, text, 1.0) for t, text in self.pages.get(query, [])][:k]
        return RetrievalResult(query, mode, docs, {"dense": 1.0})


class CharTokenizer:
    """A toy tokenizer (one token per character) so token bookkeeping can be checked by hand."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], **_: object) -> str:
        return "".join(chr(i) for i in ids)


PAGES = {"The Glass Lighthouse": "The Glass Lighthouse is an opera composed by Marisol Vantreigh in 1931.",
         "Marisol Vantreigh": "Marisol Vantreigh was born in Kestrel Harbor.",
         "Kestrel Harbor": "Kestrel Harbor is a port town.",
         "Opera": "An opera is a drama set to music."}
"""Four pages for a two-hop question: the opera, its composer, her birthplace and a distractor."""
TWO_HOP_QUESTION = "In which city was the composer of The Glass Lighthouse born?"
PAGE_ORDER = {TWO_HOP_QUESTION: ["The Glass Lighthouse", "Opera", "Kestrel Harbor", "Marisol Vantreigh"],
              "Marisol Vantreigh": ["The Glass Lighthouse", "Marisol Vantreigh", "Kestrel Harbor", "Opera"]}


class PageSearch:
    """Every mode returns the same pages for a query, in :data:`PAGE_ORDER` (so one-search plans in different modes
    show the same documents); each search reports ``ms`` of dense retrieval."""

    def __init__(self, ms: float = 1.0) -> None:
        self.calls: list[tuple[str, Mode, int]] = []
        self.ms = ms

    async def search(self, query: str, mode: Mode, k: int) -> RetrievalResult:
        self.calls.append((query, mode, k))
        docs = [RetrievedDoc(f"id-{t}", t, PAGES[t], 1.0) for t in PAGE_ORDER[query][:k]]
        return RetrievalResult(query, mode, docs, {"dense": self.ms})
