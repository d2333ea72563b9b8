"""ONNX Runtime sessions as retrieval uses them: the query encoder's, and the batched inner-product scans of the
fact table and the flat dense index (:class:`TopScan`).

Why one place: both want the same options (a pool of the process's torch width, no spin-waiting, quiet logs), and
both must survive ``os.fork``. ONNX Runtime's thread pool does not: in a forked child a session's run waits forever
for workers that only exist in the parent (a child searching with an index its parent had used hung), and freeing
the parent's session waits for them too. So a session here is made again in each process that runs it, and the
parent's is kept, never freed, in the child.
"""

from __future__ import annotations

import os
import threading
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
    """An ``onnxruntime.InferenceSession`` on the CPU for ``model`` (a path or a serialised graph), made now and
    again in any forked child that runs it."""

    def __init__(self, model: str | Path | bytes, threads: int = 0) -> None:
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

    def _make(self):  # noqa: ANN202 - an onnxruntime.InferenceSession
        import onnxruntime as ort

        return ort.InferenceSession(self.model, session_options(self.threads), providers=["CPUExecutionProvider"])


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
        """(scores, ids, lo, hi): scores and ids b × k, best first; k is at most the table's rows."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        if not len(q):
            return (np.empty((0, k), np.float32), np.empty((0, k), np.int64), np.empty(0, np.float32),
                    np.empty(0, np.float32))
        kk = np.array([k], dtype=np.int64)
        parts = [self.session.run({"q": q[start:start + self.rows], "table": self.table, "k": kk})
                 for start in range(0, q.shape[0], self.rows)]
        scores, ids, lo, hi = (np.concatenate([part[i] for part in parts]) for i in range(4))
        return scores, ids, lo, hi


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
