"""The extractor interface and the runner that feeds it passages, caches its output and counts failures."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from contextlib import nullcontext
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..cache import DiskCache
from ..corpus import Passage

log = logging.getLogger(__name__)

Triple = tuple[str, str, str]


@dataclass(slots=True)
class OpenIEResult:
    """What an extractor found in one passage (surface forms; normalisation happens at graph build).

    ``entities`` are the passage's *named* entities (HippoRAG's NER step); triple subjects and objects may also be
    common nouns. The graph keeps the difference: a mention of an entity that is neither named anywhere nor the
    title of a page is a weak link.
    """

    entities: list[str] = field(default_factory=list)
    triples: list[Triple] = field(default_factory=list)
    ok: bool = True
    error: str | None = None
    source: str = ""
    """Which extractor produced it (its identity, or ``imported:<file>``)."""

    def to_json(self) -> dict:
        d = {"entities": self.entities, "triples": [list(t) for t in self.triples], "source": self.source}
        if not self.ok:
            d["ok"] = False
            d["error"] = self.error
        return d

    @classmethod
    def from_json(cls, d: dict) -> OpenIEResult:
        return cls(entities=list(d.get("entities", [])), triples=[tuple(t) for t in d.get("triples", [])],
                   ok=bool(d.get("ok", True)), error=d.get("error"), source=d.get("source", ""))


def clean_triples(raw: object) -> list[Triple]:
    """Keep well-formed triples: three non-empty strings (numbers are turned into strings)."""
    out: list[Triple] = []
    if not isinstance(raw, (list, tuple)):
        return out
    for t in raw:
        if not isinstance(t, (list, tuple)) or len(t) != 3:
            continue
        parts = [str(x).strip() if isinstance(x, (str, int, float)) else "" for x in t]
        if all(parts):
            out.append((parts[0], parts[1], parts[2]))
    return out


def clean_entities(raw: object) -> list[str]:
    if not isinstance(raw, (list, tuple)):
        return []
    seen: dict[str, None] = {}
    for e in raw:
        if isinstance(e, (str, int, float)) and str(e).strip():
            seen.setdefault(str(e).strip(), None)
    return list(seen)


class Extractor(ABC):
    """Turns passages into entities and (subject, relation, object) triples."""

    #: Stable identity: two extractors with the same identity give the same output (cache namespace).
    identity: str
    #: Results the runner collects before writing them to the cache.
    chunk_size: int = 64

    @abstractmethod
    def extract(self, passages: Sequence[Passage]) -> Iterator[OpenIEResult]:
        """Yield one result per passage, in order, as they finish (streaming, so a single worker pool or
        request queue can serve the whole corpus). Must not raise for a bad passage."""

    def close(self) -> None:
        """Release workers or connections."""


@dataclass(slots=True)
class ExtractionStats:
    extracted: int = 0
    cached: int = 0
    imported: int = 0
    failed: int = 0


def run_extraction(
    extractor: Extractor | None,
    passages: Sequence[Passage],
    *,
    cache: DiskCache | None,
    preset: dict[str, OpenIEResult] | None = None,
    progress: bool = True,
    stats: ExtractionStats | None = None,
    bar: tqdm | None = None,
) -> tuple[list[OpenIEResult], ExtractionStats]:
    """OpenIE for every passage: ``preset`` (imported) results first, then the cache, then the extractor.

    Finished results are written to the cache every ``chunk_size`` passages and when the extractor aborts, so an
    interrupted run loses at most one chunk (a killed one) or nothing (a raised error). ``extractor`` may be
    ``None`` only when every passage is covered by ``preset`` or the cache. A caller that runs this batch by batch
    passes its own ``stats`` (added to) and ``bar`` (advanced by every passage, done or cached), so the whole
    stage shows one bar and one count.
    """
    stats = stats if stats is not None else ExtractionStats()
    failed_before = stats.failed
    results: list[OpenIEResult | None] = [None] * len(passages)
    preset = preset or {}
    todo: list[int] = []
    for i, p in enumerate(passages):
        hit = preset.get(p.hash)
        if hit is not None:
            results[i] = hit
            stats.imported += 1
        else:
            todo.append(i)
    if todo and cache is not None and extractor is not None:
        ns = _namespace(extractor)
        found = cache.get_many(ns, [passages[i].hash for i in todo])
        remaining = []
        for i in todo:
            blob = found.get(passages[i].hash)
            if blob is None:
                remaining.append(i)
            else:
                results[i] = OpenIEResult.from_json(json.loads(blob))
                stats.cached += 1
        todo = remaining
    if bar is not None:
        bar.update(len(passages) - len(todo))
    if todo:
        if extractor is None:
            raise RuntimeError(f"{len(todo)} passages have no precomputed OpenIE and no extractor is configured")
        # one bar over every passage of the stage; those imported or cached count as done from the start
        with (nullcontext(bar) if bar is not None else
              tqdm(total=len(passages), initial=len(passages) - len(todo), desc="OpenIE", unit="passage",
                   disable=not progress, leave=False)) as bar:
            stream = extractor.extract([passages[i] for i in todo])
            pending: list[int] = []
            try:
                for i in todo:
                    r = next(stream, None)
                    if r is None:
                        raise RuntimeError(f"extractor {extractor.identity} stopped before passage {passages[i].id}")
                    r.source = r.source or extractor.identity
                    results[i] = r
                    if r.ok:
                        stats.extracted += 1
                    else:
                        stats.failed += 1
                    pending.append(i)
                    if len(pending) >= extractor.chunk_size:
                        _flush(cache, extractor, passages, results, pending)
                        bar.update(len(pending))
                        pending = []
            finally:
                # whatever finished before an abort is kept, so the next run resumes after it
                _flush(cache, extractor, passages, results, pending)
                bar.update(len(pending))
        if stats.failed > failed_before:
            log.warning("OpenIE failed on %d of %d passages; they get no triples (see the warnings above) and are "
                        "retried by the next build", stats.failed - failed_before, len(todo))
    return [r for r in results if r is not None], stats


def _flush(cache: DiskCache | None, extractor: Extractor, passages: Sequence[Passage],
           results: list[OpenIEResult | None], idx: list[int]) -> None:
    """Cache the successful results among ``idx``; failures are not cached, so a later run retries them."""
    if cache is None:
        return
    done = [(passages[i].hash, results[i]) for i in idx]
    cache.put_many(_namespace(extractor), ((h, json.dumps(r.to_json()).encode()) for h, r in done if r and r.ok))


def _namespace(extractor: Extractor) -> str:
    return f"openie:{extractor.identity}"
