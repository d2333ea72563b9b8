"""benchmarks/router_table.py's paired comparison: a router against a fixed search, question by question."""

from __future__ import annotations

from pathlib import Path

from .helpers.scripts import load_script


def _router_table():
    return load_script(Path("benchmarks/router_table.py"))


def test_paired_counts_disagreements_and_gives_the_sign_tests_p() -> None:
    table = _router_table()
    router = [{"id": str(i), "em": em} for i, em in enumerate([1, 1, 1, 0, 0, 1])]
    fixed = [{"id": str(i), "em": em} for i, em in enumerate([0, 0, 1, 1, 0, 1])]
    line = table.paired("router", router, "passage", fixed)
    assert "right where it is wrong 2, the reverse 1" in line and "p = 1.00" in line
    ten_to_none = table.paired("r", [{"id": str(i), "em": 1} for i in range(10)], "f",
                               [{"id": str(i), "em": 0} for i in range(10)])
    assert "right where it is wrong 10, the reverse 0 (sign test p = 0.00)" in ten_to_none
    assert "p = 1.00" in table.paired("r", router, "f", router)  # no disagreement: nothing to test
