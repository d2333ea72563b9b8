"""Process-wide runtime settings: the BLAS limit reaches every OpenBLAS copy, whenever the process first imports numpy,
scipy or FAISS; GNU OpenMP's spin is limited before torch loads it."""

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


_SPIN_PROBE = """
import os, sys
if sys.argv[1] == "torch-first":
    import torch  # noqa: F401
from routerag.runtime import configure_threads
configure_threads()
print(os.environ.get("GOMP_SPINCOUNT", "unset"))
"""


@pytest.mark.parametrize(("given", "order", "want"), [
    ({}, "runtime-first", "3000"),  # set before torch loads GNU OpenMP, which reads it once
    ({"GOMP_SPINCOUNT": "77"}, "runtime-first", "77"),  # the user's choice stays
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "runtime-first", "unset"),  # so does a wait policy
    ({}, "torch-first", "unset"),  # too late to matter: left alone (and logged)
])
def test_openmp_spin_is_limited_before_torch_loads(given: dict, order: str, want: str) -> None:
    env = {"PATH": "/usr/bin:/bin", **given}
    out = subprocess.run([sys.executable, "-c", _SPIN_PROBE, order], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == want
