"""The documentation cannot drift from the code:

* the references (CLI, configuration, HTTP API) are regenerated and compared with the committed pages;
* every shell block of a user page is either run here on the sample corpus (the cheap ``routerag`` commands) or
  carries a ``<!-- not run: reason -->`` marker on the line before it; docs/quickstart.md's commands, the expensive
  ones included, are run by tests/test_quickstart.py;
* no user page is longer than 400 lines, research notes are dated and linked, and relative links resolve."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = ["cli.md", "cli-serve.md", "cli-training.md", "configuration.md", "api.md", "api-models.md",
             "api-models-openai.md", "openapi.json"]
USER_PAGES = sorted(DOCS.glob("*.md"))
SHELL = ("", "bash", "sh", "shell", "console")
#: ``routerag`` subcommands cheap enough to run on the sample corpus in this test (seconds each, no policy model).
CHEAP = ("build-graph", "info", "search", "index", "prepare-data", "version", "--version", "-h", "--help")
#: Run by tests/test_quickstart.py, every command of it, serve and ask included.
RUN_ELSEWHERE = {"quickstart.md"}
MARKER = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")


@pytest.mark.parametrize("name", GENERATED)
def test_generated_references_are_current(tmp_path: Path, name: str) -> None:
    from routerag.cli.reference import generate

    generate(tmp_path)
    fresh = (tmp_path / name).read_text(encoding="utf-8")
    committed = (DOCS / name).read_text(encoding="utf-8")
    assert fresh == committed, f"docs/{name} is stale: run `routerag reference --out docs`"


def test_the_configuration_example_loads(tmp_path: Path) -> None:
    from routerag.cli.settings_reference import EXAMPLE_TOML
    from routerag.config import Settings, load_settings

    path = tmp_path / "routerag.toml"
    path.write_text(EXAMPLE_TOML)
    s = load_settings(Settings, path)
    assert s.retrieval.mode == "hybrid" and s.server.max_queue == 16


def shell_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, body, why not run or None) of each shell-language fenced block."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        if m.group(1) not in SHELL:
            continue
        before = text[:m.start()].rstrip().splitlines()
        marker = MARKER.fullmatch(before[-1].strip()) if before else None
        out.append((text.count("\n", 0, m.start()) + 1, m.group(2), marker.group(1) if marker else None))
    return out


def commands(body: str) -> list[str]:
    """The command lines of a block: continuation lines joined, ``$`` prompts, comments and usage synopses (the
    generated references' ``routerag x [OPTIONS] ...``) dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = (ln.strip().removeprefix("$ ").split("  #")[0].strip() for ln in joined.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#") and "[OPTIONS]" not in ln]


def test_every_shell_block_is_run_or_says_why() -> None:
    problems = []
    for page in USER_PAGES:
        for line, body, why in shell_blocks(page):
            where = f"docs/{page.name}:{line}"
            if why is not None:
                if not why:
                    problems.append(f"{where}: a `not run` marker needs a reason")
                continue
            for cmd in commands(body):
                words = cmd.split()
                if words[0] != "routerag":
                    problems.append(f"{where}: `{cmd}` is not a routerag command: run it here or mark the block "
                                    "<!-- not run: why -->")
                elif page.name not in RUN_ELSEWHERE and (len(words) < 2 or words[1] not in CHEAP):
                    problems.append(f"{where}: `{cmd}` is too slow to run here: mark the block "
                                    "<!-- not run: why -->")
    assert not problems, "\n".join(problems)


def test_no_user_page_is_longer_than_400_lines() -> None:
    long = {p.name: n for p in [*USER_PAGES, ROOT / "README.md"]
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, f"split these pages (or move research into docs/research/): {long}"


def test_research_notes_are_dated_and_cited() -> None:
    notes = sorted((DOCS / "research").glob("*.md"))
    assert notes
    cited = "\n".join(p.read_text(encoding="utf-8") for p in USER_PAGES)
    for note in notes:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", note.name), note.name
        assert f"research/{note.name}" in cited, f"no user page links to docs/research/{note.name}"


def _prose(page: Path) -> str:
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", _prose(page), re.MULTILINE)}


def test_relative_links_and_their_anchors_resolve() -> None:
    broken = []
    for page in [*USER_PAGES, *(DOCS / "research").glob("*.md"), ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            path, _, anchor = target.partition("#")
            if "://" in target or target.startswith("mailto:"):
                continue
            dest = page.parent / path if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.fixture(scope="module")
def sample_work(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A folder like a fresh clone's root: samples/ and indexes/sample built once."""
    work = tmp_path_factory.mktemp("docs-work")
    shutil.copytree(ROOT / "samples", work / "samples")
    env = {**os.environ, "ROUTERAG_CACHE_DIR": str(work.parent / "cache"), "COLUMNS": "200"}
    res = subprocess.run([sys.executable, "-m", "routerag", "build-graph", "samples/corpus.jsonl", "--out",
                          "indexes/sample"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return work, env


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in USER_PAGES if p.name not in RUN_ELSEWHERE], ids=lambda p: p.name)
def test_the_cheap_commands_of_each_page_run(page: Path, sample_work, tmp_path: Path) -> None:
    cmds = [c for _, body, why in shell_blocks(page) if why is None for c in commands(body)]
    if not cmds:
        pytest.skip(f"docs/{page.name} has no command run here")
    template, env = sample_work
    work = tmp_path / "work"
    shutil.copytree(template, work, symlinks=True)  # each page starts from the same fresh index
    for cmd in cmds:
        argv = [sys.executable, "-m", "routerag", *shlex.split(cmd)[1:]]
        res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"docs/{page.name}: `{cmd}` failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
