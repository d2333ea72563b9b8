"""The ONNX Runtime query encoder gives the torch embedder's vectors, and a missing runtime falls back to torch."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from graph_index.atomic import TMP_MARK
from graph_index.config import EmbedderConfig
from graph_index.embedders import make_embedder
from graph_index.embedders import onnx_encoder

pytest.importorskip("onnxruntime")

TEXTS = ["Who wrote The Old Man and the Sea?", "What is the capital of Burkina Faso?", "a",
         "In what country is the birthplace of the director of the film Bad Timing, and what year was it released? " * 6]


@pytest.fixture(scope="module")
def onnx_minilm(tmp_path_factory):
    return make_embedder(EmbedderConfig(), reuse=False, runtime="onnx", cache_dir=tmp_path_factory.mktemp("cache"))


def test_onnx_vectors_match_torch(minilm, onnx_minilm) -> None:
    assert isinstance(onnx_minilm, onnx_encoder.OnnxEmbedder)
    assert onnx_minilm.identity == minilm.identity
    a = minilm.encode_queries(TEXTS)
    b = onnx_minilm.encode_queries(TEXTS)
    assert b.shape == a.shape and b.dtype == np.float32
    assert float((a * b).sum(axis=1).min()) > 0.9999
    # one at a time (no padding) equals the batch (padded): the mask is honoured
    single = np.vstack([onnx_minilm.encode_queries([t]) for t in TEXTS])
    np.testing.assert_allclose(single, b, atol=1e-5)


def test_batches_end_where_the_token_count_grows_and_keep_every_text_in_place(onnx_minilm) -> None:
    """Query batches hold at most ``batch_size`` texts and end where the token count grows once half full, so they
    barely pad; whatever the cuts, each text gets its own vector in its own place."""
    assert onnx_minilm._batches(list(range(10)), [5, 5, 5, 6, 6, 7, 7, 7, 7, 8], 4) == [[0, 1, 2], [3, 4],
                                                                                    [5, 6, 7, 8], [9]]
    texts = [f"Who wrote book number {i}{' and more' * (i % 9)}?" for i in range(150)]
    lengths = onnx_minilm._lengths(texts)
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    cuts = onnx_minilm._batches(order, lengths, 64)
    assert sorted(i for b in cuts for i in b) == list(range(150)) and max(map(len, cuts)) <= 64
    fixed = [order[i:i + 64] for i in range(0, len(order), 64)]

    def padded(batches: list[list[int]]) -> int:
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert padded(cuts) < padded(fixed) and all(2 * len(b) >= 64 for b in cuts[:-1])
    together = onnx_minilm.encode_queries(texts)
    apart = np.vstack([onnx_minilm.encode_queries([t]) for t in texts[::37]])
    np.testing.assert_allclose(together[::37], apart, atol=1e-5)


def test_export_is_cached(onnx_minilm) -> None:
    path = onnx_minilm.path
    mtime = path.stat().st_mtime_ns
    again = onnx_encoder.cached_export(_folder(), path.parent.parent)
    assert again == path and path.stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if TMP_MARK in p.name]


def test_one_text_runs_the_fused_graph(onnx_minilm) -> None:
    """A single text goes through ONNX Runtime's fused graph (made once beside the export), batches through the
    plain one; the two give the same vectors up to float32 rounding."""
    import onnx

    fused = onnx_minilm.single_path
    assert fused.name.endswith("-fused.onnx") and onnx_minilm.single_session is not onnx_minilm.session
    ops = {n.op_type for n in onnx.load(str(fused)).graph.node}
    assert {"Attention", "SkipLayerNormalization"} <= ops
    assert "Attention" not in {n.op_type for n in onnx.load(str(onnx_minilm.path)).graph.node}
    mtime = fused.stat().st_mtime_ns
    assert onnx_encoder.cached_fused(onnx_minilm.path, _folder()) == fused and fused.stat().st_mtime_ns == mtime
    batch = onnx_minilm.encode_queries(TEXTS)
    for i, text in enumerate(TEXTS):
        assert float(onnx_minilm.encode_queries([text])[0] @ batch[i]) > 0.99999


def test_a_truncated_cached_graph_is_made_again(caplog, tmp_path) -> None:
    """A cached graph ONNX Runtime cannot load (a truncated file) is removed and made again, instead of sending the
    process to the slow torch fallback."""
    first = make_embedder(EmbedderConfig(), reuse=False, runtime="onnx", cache_dir=tmp_path)
    want = first.encode_queries(TEXTS)
    for path in (first.single_path, first.path):
        path.write_bytes(path.read_bytes()[:1000])
        with caplog.at_level(logging.WARNING, logger="graph_index.embedders"):
            again = make_embedder(EmbedderConfig(), reuse=False, runtime="auto", cache_dir=tmp_path)
        assert isinstance(again, onnx_encoder.OnnxEmbedder) and f"{path} could not be loaded" in caplog.text
        assert path.stat().st_size > 1000
        np.testing.assert_allclose(again.encode_queries(TEXTS), want, atol=1e-5)
        np.testing.assert_allclose(again.encode_queries(TEXTS[:1]), want[:1], atol=1e-5)


def test_failed_fusion_runs_one_text_on_the_plain_graph(monkeypatch, caplog, tmp_path) -> None:
    from onnxruntime.transformers import optimizer

    def broken(*args, **kwargs):
        raise ValueError("unknown architecture")

    monkeypatch.setattr(optimizer, "optimize_model", broken)
    with caplog.at_level(logging.WARNING, logger="graph_index.embedders"):
        emb = make_embedder(EmbedderConfig(), reuse=False, runtime="onnx", cache_dir=tmp_path)
    assert "could not fuse" in caplog.text and emb.single_session is emb.session
    assert not list(tmp_path.glob("onnx/*-fused.onnx")) and emb.encode_queries(TEXTS[:1]).shape == (1, 384)


def test_missing_runtime_falls_back(monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.setattr(onnx_encoder, "onnx_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="graph_index.embedders"):
        emb = make_embedder(EmbedderConfig(), reuse=False, runtime="auto", cache_dir=tmp_path)
    assert not isinstance(emb, onnx_encoder.OnnxEmbedder)
    assert "onnxruntime is not installed" in caplog.text
    with pytest.raises(RuntimeError, match="onnxruntime is not installed"):
        make_embedder(EmbedderConfig(), reuse=False, runtime="onnx", cache_dir=tmp_path)


def test_failed_export_falls_back(monkeypatch, caplog, tmp_path) -> None:
    def broken(folder, target):
        raise OSError("disk full")

    monkeypatch.setattr(onnx_encoder, "export_onnx", broken)
    with caplog.at_level(logging.INFO, logger="graph_index.embedders"):
        emb = make_embedder(EmbedderConfig(), reuse=False, runtime="auto", cache_dir=tmp_path)
    assert not isinstance(emb, onnx_encoder.OnnxEmbedder)
    assert "export failed" in caplog.text


def _folder():
    from graph_index.embedders.sentence_transformers import embedded_minilm_path

    return embedded_minilm_path()


def test_int8_encoder_close_to_torch(minilm, tmp_path) -> None:
    """The per-channel int8 graph is made once beside the fp32 export and its vectors stay close to torch's (its
    effect on retrieval is measured in docs/benchmarks.md, not asserted here)."""
    emb = make_embedder(EmbedderConfig(), reuse=False, runtime="onnx-int8", cache_dir=tmp_path)
    assert isinstance(emb, onnx_encoder.OnnxEmbedder) and emb.path.name.endswith("-int8.onnx")
    cos = (minilm.encode_queries(TEXTS[:2]) * emb.encode_queries(TEXTS[:2])).sum(axis=1)
    assert float(cos.min()) > 0.97
    assert onnx_encoder.cached_int8(emb.path.with_name(emb.path.name.replace("-int8", ""))) == emb.path
    assert emb.single_session is emb.session  # no fused int8 graph
