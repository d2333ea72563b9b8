"""A distributed build on Ray: extraction and embedding spread over a cluster, the same assembly as a local build.

``routerag build-graph CORPUS -o OUT --ray auto`` (or ``--ray ray://head:10001``) runs two Ray Data stages, each a
``map_batches`` over an actor pool whose actors load their models once:

1. **passages**: OpenIE (the configured extractor, spaCy on CPU or an LLM endpoint) and the passage embedding of
   each batch of passages;
2. **texts**: the embeddings of the entity names and fact texts that the extracted triples produce.

Each batch writes its results to a Parquet file of its own in a work directory beside the index
(``.OUT.ray/``), named by a hash of the batch's contents and of the models' configuration; nothing is shared but the
file system, and no SQLite (its locking does not survive network file systems). A build that is killed and run
again skips every batch whose file exists. The final assembly runs where the command runs: it reads those files
and hands every result to the local build's own assembly (graph, synonymy, FAISS, write, atomic publish), so the
index is the one ``build-graph`` without Ray produces from the same results.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import store
from .atomic import atomic_path
from .builder import Components, Timer, _assemble
from .config import BuildConfig
from .corpus import Passage, load_corpus
from .graph import collect_content, fact_text
from .lock import DEFAULT_LOCK_TIMEOUT_S
from .openie.base import ExtractionStats, OpenIEResult

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RayBuildStats:
    """How much of each stage ran now and how much a previous run had already finished."""

    batches: dict[str, int] = field(default_factory=lambda: {"passages": 0, "texts": 0})
    skipped: dict[str, int] = field(default_factory=lambda: {"passages": 0, "texts": 0})


def work_dir(out: Path) -> Path:
    out = Path(out).absolute()
    return out.parent / f".{out.name}.ray"


def _models_key(cfg: BuildConfig) -> str:
    """What the results depend on besides the texts: the extractor's and the embedder's configuration."""
    return json.dumps({"extractor": cfg.extractor.model_dump(mode="json"),
                       "embedder": cfg.embedder.model_dump(mode="json")}, sort_keys=True)


def _key(stage: str, models: str, items: Iterable[str]) -> str:
    h = hashlib.sha256(f"{stage}\n{models}\n".encode())
    for item in items:
        h.update(item.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:24]


def _write_parquet(path: Path, columns: dict[str, Any]) -> None:
    """Atomically: a killed worker leaves a temporary file, never a partial result under the batch's name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


class _PassageWorker:
    """A Ray Data actor: the extractor and the embedder, loaded once per actor."""

    def __init__(self, cfg: BuildConfig, folder: str) -> None:
        from .embedders import make_embedder
        from .openie import make_extractor

        self.extractor = make_extractor(cfg.extractor.model_copy(update={"n_process": 1}))
        self.embedder = make_embedder(cfg.embedder)
        self.folder = Path(folder)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        for key, ids, titles, texts in zip(batch["key"], batch["ids"], batch["titles"], batch["texts"]):
            passages = [Passage(id=i, title=t, text=x) for i, t, x in zip(ids, titles, texts)]
            results = list(self.extractor.extract(passages))
            for r in results:
                r.source = r.source or self.extractor.identity
            vecs = self.embedder.encode([p.content for p in passages], progress=False)
            _write_parquet(self.folder / f"p-{key}.parquet", {
                "hash": [p.hash for p in passages],
                "openie": [json.dumps(r.to_json(), ensure_ascii=False) for r in results],
                "vector": [v.tolist() for v in vecs]})
        return {"key": list(batch["key"])}


class _TextWorker:
    """A Ray Data actor: the embedder, loaded once per actor, for entity names and fact texts."""

    def __init__(self, cfg: BuildConfig, folder: str) -> None:
        from .embedders import make_embedder

        self.embedder = make_embedder(cfg.embedder)
        self.folder = Path(folder)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        for key, texts in zip(batch["key"], batch["texts"]):
            vecs = self.embedder.encode(list(texts), progress=False)
            _write_parquet(self.folder / f"t-{key}.parquet", {"text": list(texts),
                                                              "vector": [v.tolist() for v in vecs]})
        return {"key": list(batch["key"])}


def _run_stage(rows: list[dict[str, Any]], worker: type, cfg: BuildConfig, folder: Path, actors: int) -> None:
    import ray.data

    if not rows:
        return
    ds = ray.data.from_items(rows).map_batches(
        worker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=max(1, min(actors, len(rows)))),
        # the build's own settings only (a Settings object carries the server's too), pickled with their secrets
        fn_constructor_kwargs={"cfg": BuildConfig.model_validate({k: getattr(cfg, k) for k in BuildConfig.model_fields}),
                               "folder": str(folder)}, batch_format="numpy")
    ds.materialize()


def _read(folder: Path, prefix: str, keys: Sequence[str]) -> list[Any]:
    import pyarrow.parquet as pq

    return [pq.read_table(folder / f"{prefix}-{k}.parquet") for k in keys]


def build_index_ray(
    corpus_paths: Sequence[str | Path],
    out: Path,
    cfg: BuildConfig,
    *,
    address: str | None = "auto",
    batch_size: int = 256,
    actors: int | None = None,
    force: bool = False,
    progress: bool = True,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    stats: RayBuildStats | None = None,
    components: Components | None = None,
) -> dict[str, Any]:
    """Build ``out`` from ``corpus_paths`` with extraction and embedding on Ray (see the module's notes); returns
    the manifest. ``address``: ``"auto"`` (a running cluster), ``ray://host:port``, or None (a local Ray started for
    this build, or the one already initialised in this process). ``actors``: per stage, default the cluster's CPUs.
    ``stats`` (optional) receives the batches run and skipped; ``components``: the assembly's embedder (it only
    names the model and its dimension here: every vector comes from the workers)."""
    import ray

    out = Path(out)
    stats = stats if stats is not None else RayBuildStats()
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass --force to replace it")
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        with store.write_lock(out, timeout=lock_timeout, op="build (ray)", create=True):
            if out.exists() and not force:
                raise FileExistsError(f"{out} already exists; pass --force to replace it")
            timer = Timer()
            folder = work_dir(out)
            folder.mkdir(parents=True, exist_ok=True)
            models = _models_key(cfg)
            workers = actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
            with timer("load"):
                passages, report = load_corpus(corpus_paths, **cfg.corpus.model_dump())
            with timer("openie"):
                batches = [passages[i:i + batch_size] for i in range(0, len(passages), batch_size)]
                keys = [_key("passages", models, (p.hash for p in b)) for b in batches]
                todo = [{"key": k, "ids": [p.id for p in b], "titles": [p.title for p in b],
                         "texts": [p.text for p in b]}
                        for k, b in zip(keys, batches) if not (folder / f"p-{k}.parquet").is_file()]
                stats.batches["passages"], stats.skipped["passages"] = len(todo), len(batches) - len(todo)
                log.info("ray build: %d passage batches to run, %d done before", len(todo), len(batches) - len(todo))
                _run_stage(todo, _PassageWorker, cfg, folder, workers)
                openie: dict[str, OpenIEResult] = {}
                vectors: dict[str, np.ndarray] = {}
                for table in _read(folder, "p", keys):
                    for h, o, v in zip(table["hash"].to_pylist(), table["openie"].to_pylist(),
                                       table["vector"].to_pylist()):
                        openie[h] = OpenIEResult.from_json(json.loads(o))
                        vectors[h] = np.asarray(v, dtype=np.float32)
                results = [openie[p.hash] for p in passages]
            with timer("embed_texts"):
                content = collect_content(passages, results, cfg.graph)
                texts = sorted(set(content.entities) | {fact_text(f) for f in content.facts})
                chunks = [texts[i:i + batch_size * 4] for i in range(0, len(texts), batch_size * 4)]
                tkeys = [_key("texts", models, c) for c in chunks]
                ttodo = [{"key": k, "texts": c} for k, c in zip(tkeys, chunks)
                         if not (folder / f"t-{k}.parquet").is_file()]
                stats.batches["texts"], stats.skipped["texts"] = len(ttodo), len(chunks) - len(ttodo)
                _run_stage(ttodo, _TextWorker, cfg, folder, workers)
                text_vec: dict[str, np.ndarray] = {}
                for table in _read(folder, "t", tkeys):
                    for t, v in zip(table["text"].to_pylist(), table["vector"].to_pylist()):
                        text_vec[t] = np.asarray(v, dtype=np.float32)
            ostats = ExtractionStats(extracted=sum(r.ok for r in results), failed=sum(not r.ok for r in results))
            known = (vectors, {e: text_vec[e] for e in content.entities},
                     {f: text_vec[fact_text(f)] for f in content.facts})
            comp = components or Components(cfg.model_copy(update={"use_cache": False}))
            manifest = _assemble(passages, results, comp, out, timer, previous=None, force=force,
                                 progress=progress, report=report, ostats=ostats, known=known,
                                 op={"op": "build", "engine": "ray", "corpus": [str(p) for p in corpus_paths],
                                     "added": len(passages), "batches": dict(stats.batches),
                                     "skipped_batches": dict(stats.skipped)})
            return manifest
    finally:
        if started_here:
            ray.shutdown()
