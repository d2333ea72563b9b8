"""Peak memory of ``build_index`` against the size of the corpus text: does a build hold the corpus?

    python benchmarks/build_memory.py corpus OUT.jsonl --mb 200            # a synthetic corpus of long passages
    python benchmarks/build_memory.py run CORPUS.jsonl OUT_DIR [--batch-chars N] [--json result.json]
    python benchmarks/build_memory.py compare --old /tmp/old-build --mb 50 200 [--passage-kb 20] [--json results.json]

``run`` builds CORPUS through the real :func:`graph_index.builder.build_index` (real corpus reading, cache, file
writes, graph, FAISS, atomic publish) in this process and prints its peak RSS (``ru_maxrss``) before and after the
build. The models are stand-ins, injected through :class:`~graph_index.builder.Components`, because spaCy and
MiniLM would take hours over 200 MB on 2 cores and this measures memory, not model time: :class:`NameExtractor`
takes the capitalised words of a passage's first sentence as its entities and chains them into triples, and
:class:`HashEmbedder` gives each text a random unit vector seeded by its hash (384 dimensions, as MiniLM).

``compare`` writes a corpus per size and runs ``run`` in a child process per size and code tree: the ``graph_index``
of ``--old`` (e.g. a worktree of the commit before the streaming build) and of this checkout, so each peak is the
build's own. Run it with ``PYTHONPATH`` at a checkout (the stand-ins subclass its interfaces). The corpus: passages of ~20 KB of text from a small vocabulary (few distinct entities, so the text
dominates whatever the graph needs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from graph_index.corpus import Passage
from graph_index.embedders.base import Embedder
from graph_index.openie.base import Extractor, OpenIEResult

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

NAMES = [f"{a}{b}" for a in ("Al", "Ber", "Cor", "Dan", "Ed", "Fal", "Gor", "Hal") for b in ("ton", "ville", "ard",
                                                                                          "mont", "wick")]
FILLER = ("the of and a to in is was for on that with as by at from his her which an be this had are were "
          "river city house year old new first great small long early late north south war king").split()


def make_corpus(path: Path, mb: float, passage_kb: int = 20, seed: int = 0) -> dict[str, int]:
    """A JSONL corpus of about ``mb`` MB: passages of about ``passage_kb`` KB, each made unique by its number, drawn
    from 64 blocks of text over a vocabulary of 40 names and 41 filler words."""
    rng = np.random.default_rng(seed)
    words = 1000
    blocks = []
    for _ in range(64):
        picks = rng.integers(0, len(FILLER), words)
        names = rng.random(words) < 0.05
        blocks.append(" ".join(NAMES[rng.integers(len(NAMES))] if n else FILLER[w] for w, n in zip(picks, names)))
    per = passage_kb * 1000
    n = int(mb * 1e6 // per)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            parts, size, k = [f"{NAMES[i % len(NAMES)]} {i}."], 0, i
            while size < per:
                b = blocks[k % 64]
                parts.append(b)
                size += len(b) + 1
                k = k * 31 + 7
            f.write(json.dumps({"title": f"Topic {i % 100}", "text": " ".join(parts)}) + "\n")
    return {"passages": n, "bytes": path.stat().st_size}


class NameExtractor(Extractor):
    """A stand-in extractor: the capitalised words of the first 300 characters are the entities, and each links
    to the next (``mentions``). Deterministic and cheap."""

    identity = "bench:names"
    chunk_size = 256

    def extract(self, passages: Sequence[Passage]) -> Iterator[OpenIEResult]:
        for p in passages:
            ents = list(dict.fromkeys(w.strip(".,") for w in p.text[:300].split() if w[:1].isupper()))
            yield OpenIEResult(entities=ents, triples=[(a, "mentions", b) for a, b in zip(ents, ents[1:])])


class HashEmbedder(Embedder):
    """A stand-in embedder: a random unit vector per text, seeded by the text's hash (same text, same vector)."""

    batch_size = 256

    def __init__(self, dim: int = 384) -> None:
        self._dim = dim
        self.identity = f"bench:hash-{dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        seeds = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") for t in texts]
        return np.stack([np.random.default_rng(s).standard_normal(self._dim, dtype=np.float32) for s in seeds])


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(corpus: Path, out: Path, batch_chars: int | None) -> dict:
    """Build ``corpus`` into ``out`` with the stand-in models; peak RSS before and after, wall time, counts."""
    import graph_index.builder as builder
    from routerag.config import Settings

    cfg = Settings(cache_dir=out.parent / f"{out.name}.cache")
    comp = builder.Components(cfg, embedder=HashEmbedder(), extractor=NameExtractor())
    # a build of three passages first, so the baseline holds every library a build imports (the stop-word list
    # alone brings in spaCy and torch, ~240 MB): what grows after it is the build's own
    warm = out.parent / f"{out.name}.warmup"
    warm.mkdir(parents=True, exist_ok=True)
    make_corpus(warm / "c.jsonl", 0.06)
    builder.build_index([warm / "c.jsonl"], warm / "idx", cfg, progress=False, components=comp, force=True)
    before = _rss_mb()
    kwargs = {"batch_chars": batch_chars} if batch_chars else {}
    t0 = time.perf_counter()
    manifest = builder.build_index([corpus], out, cfg, progress=False, components=comp, force=True, **kwargs)
    wall = time.perf_counter() - t0
    return {"corpus_mb": round(corpus.stat().st_size / 1e6, 1), "passages": manifest["counts"]["passages"],
            "entities": manifest["counts"]["entities"], "facts": manifest["counts"]["facts"],
            "rss_before_mb": round(before, 1), "peak_rss_mb": round(_rss_mb(), 1),
            "grown_mb": round(_rss_mb() - before, 1), "wall_s": round(wall, 1),
            "streaming": hasattr(builder, "BATCH_PASSAGES"), "timings_s": manifest["timings_s"]}


def compare(old: Path, sizes: list[float], work: Path, passage_kb: int = 20) -> list[dict]:
    rows = []
    for mb in sizes:
        corpus = work / f"corpus-{mb:g}mb.jsonl"
        if not corpus.exists():
            make_corpus(corpus, mb, passage_kb)
        for label, tree in (("old", old), ("new", ROOT)):
            env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
            res = subprocess.run([sys.executable, str(HERE), "run", str(corpus), str(work / f"idx-{label}-{mb:g}")],
                                 env=env, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(res.stderr[-3000:])
            row = {"code": label, **json.loads(res.stdout)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("out", type=Path)
    c.add_argument("--mb", type=float, default=50)
    c.add_argument("--passage-kb", type=int, default=20)
    r = sub.add_parser("run")
    r.add_argument("corpus", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--batch-chars", type=int, default=None)
    m = sub.add_parser("compare")
    m.add_argument("--old", type=Path, required=True, help="a checkout whose graph_index is the code to compare to")
    m.add_argument("--mb", type=float, nargs="+", default=[50, 200])
    m.add_argument("--passage-kb", type=int, default=20)
    m.add_argument("--work", type=Path, default=None, help="where corpora and indexes go (default: a temp dir)")
    for p in (r, m):
        p.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "corpus":
        print(json.dumps(make_corpus(args.out, args.mb, args.passage_kb)))
        return
    if args.cmd == "run":
        result = run(args.corpus, args.out, args.batch_chars)
        print(json.dumps(result))
    else:
        with tempfile.TemporaryDirectory(dir=args.work) as work:
            result = compare(args.old, args.mb, Path(work), args.passage_kb)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
