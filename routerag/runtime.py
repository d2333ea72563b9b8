"""Process-wide runtime settings for processes that serve retrieval (CLI, server, benchmarks).

On a small CPU, torch (query encoder, batched PageRank) and numpy's OpenBLAS each keep a pool of threads that
busy-wait between calls; with both pools at full width they steal each other's cores (measured on 2 cores: the
query encoder went from 16 ms to 60 ms per query). Retrieval therefore gives OpenBLAS one thread and leaves the
cores to torch; the single-query fact scan uses FAISS's SIMD kernel, which needs no BLAS thread at all.
"""

from __future__ import annotations

import os

_done = False


def configure_threads(blas_threads: int | None = None) -> None:
    """Limit BLAS threads (once per process). ``ROUTERAG_BLAS_THREADS`` overrides; 0 leaves BLAS alone."""
    global _done
    if _done:
        return
    _done = True
    env = os.environ.get("ROUTERAG_BLAS_THREADS")
    n = int(env) if env is not None else (blas_threads if blas_threads is not None else 1)
    if n <= 0:
        return
    from threadpoolctl import threadpool_limits

    _load_blas_libraries()
    threadpool_limits(limits=n, user_api="blas")


def _load_blas_libraries() -> None:
    """Load every BLAS copy retrieval uses before limiting them: threadpoolctl reaches only libraries already
    loaded, and numpy, scipy and FAISS each ship their own OpenBLAS. Called before numpy was imported, the limit
    used to reach none of them (a benchmark's batched PageRank ran 3x slower against spinning BLAS threads);
    FAISS's OpenMP build ignores ``OPENBLAS_NUM_THREADS``, so only a limit after loading reaches it."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401

    try:
        import faiss  # noqa: F401
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency
        pass


_fork_handler = False


def single_threaded_after_fork() -> None:
    """From now on, a forked child of this process runs its OpenMP libraries (torch's, FAISS's) on one thread.

    Why: GNU OpenMP's thread team does not survive a fork, and a child whose parent had searched hung in its first
    parallel region (FAISS's search, torch's top-k). With one thread no team is used. The Python-level pools
    retrieval owns are made again in the child instead (``ppr._chunk_pool``, ``facts._pool``,
    ``graph_index.ort_session``). Registered once, by the retriever's import."""
    global _fork_handler
    if not _fork_handler and hasattr(os, "register_at_fork"):
        _fork_handler = True
        os.register_at_fork(after_in_child=_one_openmp_thread)


def _one_openmp_thread() -> None:
    import sys

    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="openmp")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
