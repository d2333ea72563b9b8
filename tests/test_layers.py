"""The folders are the layers and imports run one way (docs/architecture.md): every ``import`` of every module, read
with ``ast`` (imports inside functions and ``TYPE_CHECKING`` blocks included), goes to its own layer or a lower one.

    graph_index                      corpus, cache, embedders, model clients, build settings, OpenIE, graph, index
    routerag (vocabulary, config,    the words and settings every upper layer shares, prompts, batching, metrics
      prompts, batching, ...)
    routerag.retrieval               the retriever
    routerag.policy                  the policy loop, its backends and card
    routerag.engine                  retriever + loop, built from Settings
    server | routerag.evaluation | training      the three consumers, which do not import one another, except that
                                                 training reads evaluation's records
    routerag.cli                     the one place that wires everything together
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graph_index", "routerag", "server", "training")

CONSUMERS = ("server", "routerag.evaluation", "training")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("graph_index",),
    ("routerag",),  # what no more specific prefix below claims: vocabulary, config, prompts, batching, ...
    ("routerag.retrieval",),
    ("routerag.policy",),
    ("routerag.engine",),
    CONSUMERS,
    ("routerag.cli", "routerag.__main__"),
)
CONSUMERS_MAY_IMPORT = {("training", "routerag.evaluation")}
"""Imports between the consumers that are allowed (the trainers select questions by evaluation records)."""


def _owner(module: str, prefixes: tuple[str, ...]) -> str | None:
    found = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def layer(module: str) -> tuple[int, str] | None:
    """(layer index, the prefix that places it) of one of our modules; None for anything else."""
    every = tuple(p for group in LAYERS for p in group)
    prefix = _owner(module, every)
    if prefix is None:
        return None
    return next(i for i, group in enumerate(LAYERS) if prefix in group), prefix


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, node.lineno


EDGES = [(module, path, target, line) for module, path in modules() for target, line in imports(module, path)
         if layer(target) is not None]


def test_the_modules_are_found() -> None:
    found = {m for m, _ in modules()}
    assert {"graph_index.store", "routerag.vocabulary", "routerag.policy.loop", "server.app",
            "training.verl_plugin.agent_loop", "routerag.cli.train"} <= found


def test_imports_never_go_up_a_layer() -> None:
    wrong = []
    for module, path, target, line in EDGES:
        (mine, my_prefix), (theirs, their_prefix) = layer(module), layer(target)  # type: ignore[misc]
        sideways = my_prefix in CONSUMERS and their_prefix in CONSUMERS and my_prefix != their_prefix
        if theirs > mine or (sideways and (my_prefix, their_prefix) not in CONSUMERS_MAY_IMPORT):
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} ({my_prefix}) imports {target} ({their_prefix})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


@pytest.mark.parametrize("importer, forbidden", [
    ("graph_index", ("routerag", "server", "training")),
    ("server", ("training", "routerag.evaluation", "routerag.cli")),
    ("training", ("server", "routerag.cli")),
])
def test_a_package_does_not_import_the_layers_above_it(importer: str, forbidden: tuple[str, ...]) -> None:
    hits = [f"{path.relative_to(ROOT)}:{line}: {target}" for module, path, target, line in EDGES
            if _owner(module, (importer,)) and _owner(target, forbidden)]
    assert not hits


def test_only_the_cli_wires_server_and_training_in() -> None:
    hits = [f"{path.relative_to(ROOT)}:{line}: {target}" for module, path, target, line in EDGES
            if _owner(module, ("routerag",)) and not _owner(module, ("routerag.cli", "routerag.__main__"))
            and _owner(target, ("server", "training"))]
    assert not hits
