"""Retrieval's BLAS limit reaches every OpenBLAS copy, whenever the process first imports numpy, scipy or FAISS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("threadpoolctl")

_PROBE = """
from routerag.runtime import configure_threads
configure_threads()  # before numpy is imported: the order that once limited nothing
import numpy, scipy.linalg, faiss, json
from threadpoolctl import threadpool_info
print(json.dumps([[i["filepath"], i["num_threads"]] for i in threadpool_info() if i["user_api"] == "blas"]))
"""


def test_the_limit_reaches_blas_libraries_loaded_after_it() -> None:
    env = {"PATH": "/usr/bin:/bin", "ROUTERAG_BLAS_THREADS": "1", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    libs = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(libs) >= 2, libs  # numpy's and FAISS's OpenBLAS at least
    assert all(threads == 1 for _, threads in libs), libs
