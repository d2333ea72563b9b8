"""Lower bounds on a query's cost on this machine: the work each stage must do, divided by the fastest this machine
ran that kind of work (issue 19's "physical limit").

Why: a target such as 500 end-to-end queries/s on 2 cores is either an engineering gap or arithmetic that cannot
fit. This measures which, from the questions themselves and the index, instead of asserting it.

* Work per query: the query encoder's floating-point operations, counted from the model's shapes and each
  question's own token count (no padding: the most favourable case); the fact match and the dense passage match as
  one matrix-vector product each (2 · rows · dim); PageRank as the solver's full sparse products (steps · nnz), for
  comparison only (its first steps are local, so that is not a floor).
* Machine rates, each the best of several runs on all threads: a large float32 GEMM, the fastest of torch's,
  numpy's and ONNX Runtime's (an upper bound on what any float32 matrix product reaches, the encoder's small ones
  included) and the read bandwidth of a 200 MB array (beyond every cache).
* Floors: batched, a stage cannot beat its FLOPs at the GEMM rate; single, the float16 fact table (what the exact
  screen reads, ``routerag/retrieval/facts.py``) and the passage table cannot be read faster than the bandwidth.

    python benchmarks/retrieval_bench.py INDEX QUESTIONS --modes hybrid --latency 100 --floors
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

EMBEDDED_IDENTITY = "st:all-MiniLM-L6-v2"


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def machine_rates(repeats: int = 7) -> dict[str, float]:
    """The best float32 GEMM rate (GFLOP/s), int8 GEMM rate (GOP/s, fbgemm's dynamic quantised linear, as an int8
    encoder would run) and read bandwidth (GB/s) this machine reaches on all threads."""
    import warnings

    import torch
    from torch.ao.nn.quantized.dynamic import Linear

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = 2 * n**3
    # the best of the float32 GEMMs at hand: torch's (MKL) alone ran at 235 GFLOP/s on an AMD AVX-512 machine
    # where ONNX Runtime ran the encoder itself at ~340, which made its "floor" slower than the measurement
    gemm_by = {"torch": flops / best_seconds(lambda: torch.mm(a, b), repeats) / 1e9,
               "numpy": _numpy_gemm_rate(a.numpy(), b.numpy(), torch.get_num_threads(), repeats),
               "onnxruntime": _onnxruntime_gemm_rate(a.numpy(), b.numpy(), torch.get_num_threads(), repeats)}
    gemm = max(v for v in gemm_by.values() if v is not None)
    with warnings.catch_warnings():  # quantised tensor constructors are deprecated; the kernel is what we time
        warnings.simplefilter("ignore")
        lin = Linear(n, n)
        lin.set_weight_bias(torch.quantize_per_tensor(torch.randn(n, n), 0.01, 0, torch.qint8), None)
        int8 = 2 * n**3 / best_seconds(lambda: lin(a), repeats) / 1e9
    big = torch.ones(50_000_000)  # 200 MB
    read = big.numel() * 4 / best_seconds(big.sum, repeats) / 1e9
    return {"gemm_gflops": round(gemm, 1), "gemm_gflops_by_library": {k: None if v is None else round(v, 1)
                                                                      for k, v in gemm_by.items()},
            "int8_gemm_gops": round(int8, 1), "read_gb_s": round(read, 1), "torch_threads": torch.get_num_threads()}


def _numpy_gemm_rate(a: np.ndarray, b: np.ndarray, threads: int, repeats: int) -> float:
    """numpy's (OpenBLAS) float32 GEMM on ``threads`` threads, whatever limit retrieval set for its own calls."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        return 2 * a.shape[0] ** 3 / best_seconds(lambda: a @ b, repeats) / 1e9


def _onnxruntime_gemm_rate(a: np.ndarray, b: np.ndarray, threads: int, repeats: int) -> float | None:
    """ONNX Runtime's float32 MatMul (the kernels the query encoder runs on), or None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    n = a.shape[0]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
                              [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return 2 * n**3 / best_seconds(lambda: session.run(None, {"a": a}), repeats) / 1e9


def spmm_rate(solver, widths: tuple[int, ...] = (1, 8, 16, 32, 64, 128), repeats: int = 5) -> float:  # noqa: ANN001
    """The best rate (G nonzero·columns/s) of the PageRank solver's own sparse product, accumulated in place as the
    solver does it (``addmv_``/``addmm_``), over block widths."""
    import torch

    best = 0.0
    for w in widths:
        x, y = (torch.randn(solver.n, w), torch.zeros(solver.n, w)) if w > 1 else (torch.randn(solver.n),
                                                                                   torch.zeros(solver.n))
        acc = y.addmm_ if w > 1 else y.addmv_
        best = max(best, solver.M.nnz * w / best_seconds(lambda: acc(solver._torch_M, x, alpha=0.5), repeats) / 1e9)
    return best


def encoder_flops(folder: Path, questions: list[str]) -> list[float]:
    """FLOPs of a BERT-style encoder per question, from its config and each question's token count: the dense
    layers (4 h² for attention projections, 2 h·i for the feed-forward, per token and layer) and the attention
    itself (2 s·h for scores and 2 s·h for the weighted sum, per token and layer), at 2 FLOPs per multiply-add."""
    from tokenizers import Tokenizer

    cfg = json.loads((folder / "config.json").read_text())
    layers, h, inner = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()  # each question at its own length: the fewest FLOPs
    st_cfg = folder / "sentence_bert_config.json"
    tok.enable_truncation(int(json.loads(st_cfg.read_text()).get("max_seq_length", 256)) if st_cfg.is_file() else 256)
    out = []
    for e in tok.encode_batch(questions):
        s = len(e.ids)
        out.append(2.0 * layers * s * (4 * h * h + 2 * h * inner + 2 * s * h))
    return out


def floors(retriever, questions: list[str], measured: dict | None = None) -> dict:  # noqa: ANN001 - a Retriever
    """Work per query, machine rates and the resulting floors; ``measured`` (retrieval_bench's hybrid speed entry)
    is set beside them. The encoder's FLOPs are counted from the embedded MiniLM's folder, so an index embedded by
    another model is refused rather than given another model's floors."""
    from graph_index.embedders.sentence_transformers import embedded_minilm_path

    if retriever.embedder.identity != EMBEDDED_IDENTITY:
        raise ValueError(f"--floors counts the embedded MiniLM's work; this index is embedded with "
                         f"{retriever.embedder.identity}")
    rates = machine_rates()
    gflops, bw = rates["gemm_gflops"], rates["read_gb_s"]
    retriever._ensure_graph()
    spmm = spmm_rate(retriever.solver)
    rates["spmm_g_nnz_cols_s"] = round(spmm, 3)
    folder = embedded_minilm_path()
    enc = np.asarray(encoder_flops(folder, questions))
    n_facts, dim = retriever.fact_scorer.emb.shape if len(retriever.facts) else (0, retriever.embedder.dim)
    n_pass = retriever.n_passages
    work = {"encoder_mflop_mean": round(float(enc.mean()) / 1e6, 1),
            "encoder_mflop_min": round(float(enc.min()) / 1e6, 1),
            "facts_mflop": round(2 * n_facts * dim / 1e6, 1), "dense_mflop": round(2 * n_pass * dim / 1e6, 2),
            "fact_table_f16_mb": round(n_facts * dim * 2 / 1e6, 1),
            "passage_table_f32_mb": round(n_pass * dim * 4 / 1e6, 1),
            "ppr_full_products_nnz_millions": round(retriever.solver.steps * retriever.solver.M.nnz / 1e6, 2)}
    batched = {"encode": float(enc.mean()) / (gflops * 1e6),
               "encode_if_int8": float(enc.mean()) / (rates["int8_gemm_gops"] * 1e6),
               "facts": 2 * n_facts * dim / (gflops * 1e6),
               "dense": 2 * n_pass * dim / (gflops * 1e6)}
    single = {"encode": float(enc.mean()) / (gflops * 1e6), "facts": n_facts * dim * 2 / (bw * 1e6),
              "dense": n_pass * dim * 4 / (bw * 1e6)}
    rest = batched["facts"] + batched["dense"]
    ppr = retriever.solver.steps * retriever.solver.M.nnz / (spmm * 1e6)
    out = {"machine": rates, "work_per_query": work,
           "batched_floor_ms_per_query": {k: round(v, 3) for k, v in batched.items()},
           "batched_ceiling_qps_without_pagerank": round(1000 / (batched["encode"] + rest), 1),
           "batched_ceiling_qps_without_pagerank_int8_encoder": round(1000 / (batched["encode_if_int8"] + rest), 1),
           "ppr_full_products_at_best_spmm_ms_per_query": round(ppr, 3),
           "batched_estimate_qps_int8_encoder_and_pagerank": round(1000 / (batched["encode_if_int8"] + rest + ppr), 1),
           "single_floor_ms": {k: round(v, 3) for k, v in single.items()},
           "single_floor_ms_without_pagerank": round(sum(single.values()), 2)}
    if measured:
        out["measured_batched_ms_per_query"] = measured.get("end_to_end", {}).get("batched_ms_per_query_by_stage")
        out["measured_single_median_ms"] = measured.get("end_to_end", {}).get("single_median_ms_by_stage")
    return out
