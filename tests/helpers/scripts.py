"""Load a script that is not a package module (a benchmark, the compose file's build service) by its path, so a test
can call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: Path) -> ModuleType:
    """The module at ``path`` (relative to the repository root, or absolute), executed once per call."""
    path = path if path.is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
