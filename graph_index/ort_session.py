"""ONNX Runtime sessions as retrieval uses them: the query encoder's, and the inner-product scans of the fact table
and the flat dense index: :class:`TopScan` for batches, :class:`Int8Screen` for a few queries.

Why one place: both want the same options (a pool of the process's torch width, no spin-waiting, quiet logs), and
both must survive ``os.fork``. ONNX Runtime's thread pool does not: in a forked child a session's run waits forever
for workers that only exist in the parent (a child searching with an index its parent had used hung), and freeing
the parent's session waits for them too. So a session here is made again in each process that runs it, and the
parent's is kept, never freed, in the child.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_INHERITED: list[Any] = []
"""Sessions a forked child inherited from its parent (never freed: see the module docstring)."""


def default_threads() -> int:
    """torch's thread count: the width every ONNX Runtime pool here takes unless told otherwise."""
    try:
        import torch

        return max(1, torch.get_num_threads())
    except ImportError:  # pragma: no cover - torch is a dependency
        return max(1, os.cpu_count() or 1)


def session_options(threads: int = 0):  # noqa: ANN201 - an onnxruntime.SessionOptions
    """``threads``: the intra-op pool's width (0: :func:`default_threads`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # no spin-waiting after a run: the idle pool would otherwise hold both cores while the retrieval that follows
    # (torch's fact scan, the PageRank) needs them (it made the fact match 15x slower)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class ProcessSession:
    """An ``onnxruntime.InferenceSession`` on the CPU for ``model`` (a path, a serialised graph, or a function that
    serialises it: a graph holding a large constant need not be kept in memory for a child), made now and again in
    any forked child that runs it."""

    def __init__(self, model: str | Path | bytes | Callable[[], bytes], threads: int = 0) -> None:
        self.model = str(model) if isinstance(model, Path) else model
        self.threads = threads
        self._lock = threading.Lock()
        self._session = self._make()
        self._pid = os.getpid()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """All outputs of one run."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    _INHERITED.append(self._session)
                    self._session = self._make()
                    self._pid = os.getpid()
        return self._session.run(None, feeds)

    def __del__(self) -> None:
        # freed in a forked child (its owner was garbage the parent had not collected yet): freeing the parent's
        # session would wait forever on the parent's pool, so it is kept instead
        if getattr(self, "_pid", None) not in (None, os.getpid()):
            _INHERITED.append(self._session)

    def _make(self):  # noqa: ANN202 - an onnxruntime.InferenceSession
        import onnxruntime as ort

        model = self.model() if callable(self.model) else self.model
        return ort.InferenceSession(model, session_options(self.threads), providers=["CPUExecutionProvider"])


class TopScan:
    """Each query's top k rows of a fixed table by inner product, with their scores, and the query's minimum and
    maximum score over the whole table: ``Gemm(q, tableᵀ)``, ``TopK``, ``ReduceMin`` and ``ReduceMax`` in one
    ONNX Runtime graph, so the score block never leaves ONNX Runtime and only k + 2 numbers per query do.

    Why ONNX Runtime: its GEMM (MLAS) ran these shapes 2-3x faster than torch's, numpy's or FAISS's float32 GEMM
    on the benchmark host, and its TopK and reductions run on the same pool. ONNX's TopK returns equal scores
    lowest index first. The table is an input of each run, not a graph constant, so ONNX Runtime wraps the
    (possibly memory-mapped) array instead of keeping a packed copy of it.
    """

    ROWS = 256
    """Most queries per run. On the PopQA fact table 64 rows took 0.206, 128 0.158, 256 0.142 and 512 0.133 ms
    per query."""
    BLOCK_BYTES = 64 << 20
    """Largest score block (rows × table rows, float32) of one run. ONNX Runtime's arena keeps what the largest
    run needed: after a batch of PopQA questions the process held 140 MB more with 256 rows, 73 MB with 128 and
    39 MB with 64 (without the arena nothing, but the fact stage took 0.218 against 0.145 ms per query, each run's
    pages faulted in anew). The cap keeps a table of a million rows at 16 queries per run, not 1 GB a run."""

    def __init__(self, table: np.ndarray, threads: int = 0, *, owner: object = None) -> None:
        """``owner``: whatever owns ``table``'s memory when it is a view into a library's storage (a FAISS
        index), kept alive as long as this scan."""
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.owner = owner
        self.rows = max(8, min(self.ROWS, self.BLOCK_BYTES // max(1, 4 * len(self.table))))
        self.session = ProcessSession(_scan_graph(self.table.shape[1]), threads)

    def __call__(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(scores, ids, lo, hi): scores and ids b × min(k, rows), best first."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        k = min(k, len(self.table))
        if not len(q):
            return (np.empty((0, k), np.float32), np.empty((0, k), np.int64), np.empty(0, np.float32),
                    np.empty(0, np.float32))
        kk = np.array([k], dtype=np.int64)
        parts = [self.session.run({"q": q[start:start + self.rows], "table": self.table, "k": kk})
                 for start in range(0, q.shape[0], self.rows)]
        scores, ids, lo, hi = (np.concatenate([part[i] for part in parts]) for i in range(4))
        return scores, ids, lo, hi


class Int8Screen:
    """The exact top k of a few queries' inner products with a fixed float32 table (and, when asked, each query's
    exact minimum and maximum over it): an int8 copy of the table is scanned in ONNX Runtime, and only the rows
    whose int8 score a proven error bound cannot rule out are scored again in float32.

    Why: one query's scan is bound by reading the table. The int8 copy is a quarter of the float32 bytes and half
    of the float16 ones, and ONNX Runtime's ``MatMulInteger`` with an unsigned query and a signed constant table
    (the layout x86's VNNI instructions multiply, prepacked when the session is made) read the PopQA fact table
    (66,890 × 384) in 0.26 ms, where torch's float16 matrix-vector product took 1.17 (a signed query took 7.6).
    Inside searches, where the encoder has just pushed the table out of the caches, the fact stage took 1.03
    against 1.66 ms.

    The bound: each table row f is stored as s·w (w int8 in ±63, s its largest |component| / 63: see
    :data:`TABLE_LEVELS`) and the query q as t·u (u int8 + 128 as uint8, with zero point 128). For every row,
    |q·f − t·s·(u·w)| ≤ ‖q‖·E + ‖q − t·u‖·H, where E is the largest ‖f − s·w‖ over the rows and H the largest ‖s·w‖
    (Cauchy–Schwarz on each term), plus the float32 rounding of s·(u·w) (u·w itself is an exact integer). So the true
    top k lie within twice that bound of the k-th best int8 score, and the true minimum within twice it of the
    lowest: those rows (19 of 66,890 on the median PopQA question, measured with codes in ±127) are all that is
    scored in float32. The result is the float32 scan's, up to its own rounding.
    """

    MAX_BYTES = 1 << 30
    """Largest int8 copy: the graph that carries it is one protobuf message, which cannot pass 2 GB (a table of
    2.8 million rows of 384; past it the caller keeps its float scan)."""

    @classmethod
    def fits(cls, table: np.ndarray) -> bool:
        return 0 < table.shape[0] * table.shape[1] <= cls.MAX_BYTES

    def __init__(self, table: np.ndarray, threads: int = 0, *, with_range: bool = False,
                 owner: object = None) -> None:
        """``with_range``: also find each query's exact minimum and maximum score (the fact match needs them).
        ``owner``: as for :class:`TopScan` (the rescoring reads ``table``)."""
        if not self.fits(table):
            raise ValueError(f"an int8 screen takes 1 to {self.MAX_BYTES} table entries, not {table.size}")
        self.table = table  # float32 rows for the rescoring (possibly memory-mapped: only candidates are read)
        self.owner = owner
        self.n, self.dim = table.shape
        self.with_range = with_range
        codes, scale, err, hat = _quantise(table)
        self.err, self.hat = err, hat
        made = [_int8_graph(codes, scale, with_range)]
        del codes

        def model() -> bytes:  # the first session takes the graph made here; a forked child quantises again
            return made.pop() if made else _int8_graph(*_quantise(table)[:2], with_range)  # no cycle via self

        self.session = ProcessSession(model, threads)

    def memory_bytes(self) -> int:
        """What the screen holds: ONNX Runtime keeps the int8 table twice (as given and prepacked; 54 MB RSS for the
        PopQA facts' and passages' 27 MB of codes), plus the row scales."""
        return 2 * self.n * self.dim + 4 * self.n

    def bound(self, q: np.ndarray, step: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Per query row: the largest |q·f − step·s·(codes·w)| over the table's rows f = s·w + error (see the class
        docstring)."""
        q64 = q.astype(np.float64)
        norm = np.sqrt((q64 * q64).sum(axis=1))
        off = np.sqrt(((q64 - step[:, None] * codes) ** 2).sum(axis=1))
        rounding = 2.0**-23 * (norm + off) * self.hat  # float32 rounding of s · (u·w), relative
        return (norm * self.err + off * self.hat + rounding) * (1 + 1e-6)

    def __call__(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(scores, ids, lo, hi) as :class:`TopScan` gives them: b × k best first, ties by lower id; ``lo`` and
        ``hi`` are each query's exact minimum and maximum over the table with ``with_range``, else NaN."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        b = q.shape[0]
        k = min(k, self.n)
        step = np.abs(q).max(axis=1).astype(np.float64) / 127
        step[step == 0] = 1
        codes = np.clip(np.rint(q / step[:, None]), -127, 127)
        feeds = {"u": (codes + 128).astype(np.uint8)}
        margin = (2 * self.bound(q, step, codes) / step)[:, None]  # in the graph's units: score / step
        width = min(self.n, max(4 * k, 32))
        while True:  # the graph's top (and bottom) ``width`` int8 scores must reach past the margin
            feeds["width"] = np.array([width], dtype=np.int64)
            out = self.session.run(feeds)
            top_v, top_i = out[0], out[1]
            cut = top_v[:, k - 1:k] - margin
            short = top_v[:, -1:] >= cut
            if self.with_range:
                low_v, low_i = out[2], out[3]
                floor = low_v[:, :1] + margin
                short |= low_v[:, -1:] <= floor
            if width == self.n or not short.any():
                break
            width = min(self.n, width * 4)
        scores = np.empty((b, k), dtype=np.float32)
        ids = np.empty((b, k), dtype=np.int64)
        lo = np.full(b, np.nan, dtype=np.float32)
        hi = np.full(b, np.nan, dtype=np.float32)
        for r in range(b):
            cand = top_i[r][top_v[r] >= cut[r]]
            if self.with_range:
                cand = np.unique(np.concatenate([cand, low_i[r][low_v[r] <= floor[r]]]))
            exact = self.table[cand] @ q[r]
            order = np.lexsort((cand, -exact))[:k]
            scores[r], ids[r] = exact[order], cand[order]
            if self.with_range:
                lo[r], hi[r] = exact.min(), exact.max()
        return scores, ids, lo, hi


TABLE_LEVELS = 63
"""The table's int8 codes lie in ±63, not ±127. Why: on x86 CPUs without VNNI (AVX2 only), ONNX Runtime's
``MatMulInteger`` multiplies uint8 by int8 with ``vpmaddubsw``, which adds each pair of products into a saturating
int16: with the query's codes up to 255, two products of ±127 (64,770) overflow and the int8 scores, and so the
screen's top k, come out wrong (seen on an AMD EPYC with AVX2 alone); two of ±63 (32,130) cannot. The bound below
is computed from the codes actually stored, so it stays proven; it is about twice as wide."""


def _quantise(table: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(codes dim × n int8, scale n float32, E, H) for :class:`Int8Screen`: each row over its own scale, a chunk of
    rows at a time (no float copy of the whole table).

    E and H are computed in float32 (float64 took 0.96 s for the PopQA facts) and then rounded up past that
    arithmetic's error: a component of f − s·w is off by at most u·|s·w| (u = 2⁻²⁴; the product's rounding, the
    difference being far smaller than either term), so ‖f − s·w‖ is at most the computed norm plus u·H, and a norm
    of ``dim`` float32 squares is within a relative dim·u of the exact one."""
    n, dim = table.shape
    scale = np.empty(n, dtype=np.float32)
    codes = np.empty((dim, n), dtype=np.int8)  # transposed: the constant right-hand side of MatMulInteger
    err = hat = 0.0
    w = np.empty((min(chunk, n), dim), dtype=np.float32)  # buffers reused by every chunk (fresh ones page-fault)
    diff = np.empty_like(w)
    for start in range(0, n, chunk):
        f = np.asarray(table[start:start + chunk], dtype=np.float32)
        m = len(f)
        s = np.abs(f).max(axis=1) / np.float32(TABLE_LEVELS)
        if not np.isfinite(s).all():
            row = start + int(np.flatnonzero(~np.isfinite(s))[0])
            raise ValueError(f"an int8 screen needs finite table values; row {row} holds NaN or infinity")
        s[s == 0] = 1
        wm, dm = w[:m], diff[:m]
        np.divide(f, s[:, None], out=wm)
        np.rint(wm, out=wm)
        np.clip(wm, -TABLE_LEVELS, TABLE_LEVELS, out=wm)
        codes[:, start:start + m] = wm.astype(np.int8).T
        np.multiply(wm, s[:, None], out=wm)  # the stored row s·w
        hat = max(hat, float(np.sqrt(np.einsum("ij,ij->i", wm, wm).max())))
        np.subtract(f, wm, out=dm)
        err = max(err, float(np.sqrt(np.einsum("ij,ij->i", dm, dm).max())))
        scale[start:start + m] = s
    slack = 1 + 2 * dim * 2.0**-24
    hat *= slack
    return codes, scale, (err * slack + 2.0**-24 * hat) * slack, hat


def _int8_graph(codes: np.ndarray, scale: np.ndarray, with_range: bool) -> bytes:
    """The serialised ONNX graph of :class:`Int8Screen`: the scores ``MatMulInteger(u, codes) · scale`` of uint8
    queries with zero point 128, of which only the top ``width`` (and with ``with_range`` the bottom ``width``)
    leave it."""
    from onnx import TensorProto, helper, numpy_helper

    dim, _ = codes.shape
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("MatMulInteger", ["u", "codes", "zero"], ["dots"]),
             helper.make_node("Cast", ["dots"], ["dots_f"], to=f32),
             helper.make_node("Mul", ["dots_f", "scale"], ["scores"]),
             helper.make_node("TopK", ["scores", "width"], ["top", "top_ids"], axis=1, largest=1, sorted=1)]
    outputs = [helper.make_tensor_value_info("top", f32, ["b", "w"]),
               helper.make_tensor_value_info("top_ids", i64, ["b", "w"])]
    if with_range:
        nodes.append(helper.make_node("TopK", ["scores", "width"], ["low", "low_ids"], axis=1, largest=0, sorted=1))
        outputs += [helper.make_tensor_value_info("low", f32, ["b", "w"]),
                    helper.make_tensor_value_info("low_ids", i64, ["b", "w"])]
    graph = helper.make_graph(
        nodes, "int8_screen",
        [helper.make_tensor_value_info("u", TensorProto.UINT8, ["b", dim]),
         helper.make_tensor_value_info("width", i64, [1])], outputs,
        initializer=[numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scale, "scale"),
                     numpy_helper.from_array(np.array(128, dtype=np.uint8), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _scan_graph(dim: int) -> bytes:
    """The serialised ONNX graph of :class:`TopScan`."""
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["q", "table"], ["s"], transB=1),
         helper.make_node("TopK", ["s", "k"], ["scores", "ids"], axis=1, largest=1, sorted=1),
         helper.make_node("ReduceMin", ["s"], ["lo"], axes=[1], keepdims=0),
         helper.make_node("ReduceMax", ["s"], ["hi"], axes=[1], keepdims=0)],
        "top_scan",
        [helper.make_tensor_value_info("q", f32, ["b", dim]), helper.make_tensor_value_info("table", f32, ["n", dim]),
         helper.make_tensor_value_info("k", i64, [1])],
        [helper.make_tensor_value_info("scores", f32, ["b", "k"]),
         helper.make_tensor_value_info("ids", i64, ["b", "k"]),
         helper.make_tensor_value_info("lo", f32, ["b"]), helper.make_tensor_value_info("hi", f32, ["b"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def onnx_available() -> bool:
    """Whether ONNX Runtime is importable (the fast query encoder's and the batch scans' only extra dependency)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True
