"""The compose file's one-shot `build` service: build the index from the mounted corpus once, then exit 0.

    python3 build_index.py CORPUS_DIR INDEX_DIR OPENIE_URL

* An index already at INDEX_DIR (its manifest is there): exit 0 at once, so a restart of the stack neither rebuilds
  nor waits for the OpenIE server. Add documents later with `POST /documents` or `routerag index add`.
* Otherwise wait for OPENIE_URL/health (the first start of vLLM downloads the weights: up to
  ROUTERAG_OPENIE_WAIT_S, 1800 s by default), then run `routerag build-graph` over every .jsonl and .json file in
  CORPUS_DIR with the LLM extractor (the ROUTERAG_EXTRACTOR__LLM_* variables name the server and model).
* No corpus files, a server that never comes up, or a failed build: a one-line error and exit 1, so the server,
  which waits for this service to complete successfully, does not start on a missing index.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def corpus_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix in (".jsonl", ".json") and p.is_file())


def wait_healthy(url: str, timeout_s: float, every_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    corpus, index, openie = Path(argv[0]), Path(argv[1]), argv[2]
    if (index / "manifest.json").is_file():
        print(f"{index}: already built; nothing to do", flush=True)
        return 0
    files = corpus_files(corpus)
    if not files:
        print(f"error: no .jsonl or .json corpus files in {corpus} (mount your corpus there: CORPUS_DIR)",
              file=sys.stderr)
        return 1
    wait_s = float(os.environ.get("ROUTERAG_OPENIE_WAIT_S", "1800"))
    print(f"waiting up to {wait_s:.0f} s for the OpenIE server at {openie}", flush=True)
    if not wait_healthy(openie, wait_s):
        print(f"error: the OpenIE server at {openie} was not healthy within {wait_s:.0f} s", file=sys.stderr)
        return 1
    cmd = ["routerag", "build-graph", *map(str, files), "--out", str(index), "--extractor", "llm"]
    print("running: " + " ".join(cmd), flush=True)
    return 0 if subprocess.call(cmd) == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
