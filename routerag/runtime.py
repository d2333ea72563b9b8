"""Process-wide runtime settings for processes that serve retrieval (CLI, server, benchmarks).

On a small CPU, the thread pools of the libraries retrieval uses busy-wait between calls and take cores from each
other (measured on 2 cores: the query encoder went from 16 ms to 60 ms per query against spinning BLAS threads).
Retrieval therefore gives OpenBLAS one thread (its BLAS work is split over Python threads where it matters), and
lets GNU OpenMP's workers (torch's) spin only briefly after a parallel region.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

_done = False

OPENMP_SPIN = 3000
"""GNU OpenMP's spin count (``GOMP_SPINCOUNT``) in processes that serve retrieval: how long an idle OpenMP worker
busy-waits for the next parallel region before it sleeps. The default, 300,000, kept torch's worker spinning for
milliseconds after a single query's PageRank, on one of the two cores the next query's ONNX Runtime encoder needed:
its encoding took 3.3-3.5 ms against 2.6-2.7 with 3,000, and a PopQA search's p50 7.6-7.8 against 6.7-6.9 ms
(200 questions, processes alternating), the PageRank itself unchanged (3.0 ms). With no spinning at all
(``OMP_WAIT_POLICY=PASSIVE``) each of the PageRank's products woke its worker anew: 3.5-4.6 ms."""


def limit_openmp_spin() -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`OPENMP_SPIN` unless the user chose a spin or wait policy. GNU OpenMP reads
    it once, when torch loads it, so this only takes effect before torch is imported (it is said in the log
    otherwise)."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    if "torch" in sys.modules:
        log.info("torch is already loaded: its OpenMP workers keep their default spin (set GOMP_SPINCOUNT=%d "
                 "before starting the process for faster single queries)", OPENMP_SPIN)
        return
    os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN)


def configure_threads(blas_threads: int | None = None) -> None:
    """Limit BLAS threads (once per process; ``ROUTERAG_BLAS_THREADS`` overrides, 0 leaves BLAS alone) and
    OpenMP's spinning (:func:`limit_openmp_spin`)."""
    global _done
    if _done:
        return
    _done = True
    limit_openmp_spin()
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
