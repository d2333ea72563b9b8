"""The documentation cannot drift from the code: the CLI and API references are regenerated and compared."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["cli.md", "api.md", "openapi.json"])
def test_generated_references_are_current(tmp_path: Path, name: str) -> None:
    from routerag.cli.reference import generate

    generate(tmp_path)
    fresh = (tmp_path / name).read_text(encoding="utf-8")
    committed = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert fresh == committed, f"docs/{name} is stale: run `routerag reference --out docs`"
