"""The distributed build (issue 18) on a real local Ray (2 CPUs): extraction and embedding as Ray Data actor-pool
stages writing one Parquet file per batch, the local build's assembly, the same index as a single-process build,
and a re-run that skips the batches already done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_index.builder import Components, build_index
from routerag.config import RetrievalConfig, Settings
from routerag.retrieval import Retriever

ray = pytest.importorskip("ray", reason="the distributed build needs ray (pip install ray)")

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "twohop.jsonl"  # 10 passages: in batches of 3, four batches
QUERIES = ["Where was Joran Veld born?", "What does Tarsk trade?", "Which river flows through Brannock?",
           "Who made windows for chapels?"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=150 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


def top10(index: Path, minilm) -> dict[str, list[list[str]]]:
    r = Retriever(index, RetrievalConfig(), embedder=minilm)
    return {m: [[d.id for d in res.docs] for res in r.search(QUERIES, mode=m, k=10)] for m in ("passage", "graph",
                                                                                               "hybrid")}


def test_a_ray_build_equals_the_local_build_and_resumes(local_ray, tmp_path: Path, minilm, spacy_extractor) -> None:
    from graph_index.ray_build import RayBuildStats, build_index_ray, work_dir

    corpus = [CORPUS]
    cfg = Settings(cache_dir=tmp_path / "cache")
    local = build_index(corpus, tmp_path / "local", cfg, progress=False,
                        components=Components(cfg, embedder=minilm, extractor=spacy_extractor))
    stats = RayBuildStats()
    # one actor per stage: each loads its models once (the cost of a test on 2 cores is the actors' start-up)
    built = build_index_ray(corpus, tmp_path / "ray", cfg, address=None, batch_size=3, actors=1, progress=False,
                            stats=stats, components=Components(cfg, embedder=minilm))
    assert stats.batches["passages"] == 4 and stats.skipped["passages"] == 0
    assert built["counts"] == local["counts"]
    assert built["history"][-1]["engine"] == "ray"
    assert top10(tmp_path / "ray", minilm) == top10(tmp_path / "local", minilm)
    parts = sorted(work_dir(tmp_path / "ray").glob("p-*.parquet"))
    assert len(parts) == 4 and not list(work_dir(tmp_path / "ray").glob("*.tmp-*"))

    # a re-run after a kill: the batches with a result file are not run again
    parts[2].unlink()
    again = RayBuildStats()
    rebuilt = build_index_ray(corpus, tmp_path / "ray", cfg, address=None, batch_size=3, actors=1, progress=False,
                              stats=again, force=True, components=Components(cfg, embedder=minilm))
    assert again.batches == {"passages": 1, "texts": 0} and again.skipped["passages"] == 3
    assert rebuilt["counts"] == local["counts"]
    assert top10(tmp_path / "ray", minilm) == top10(tmp_path / "local", minilm)
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["history"][-1]["skipped_batches"]["passages"] == 3
