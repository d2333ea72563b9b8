"""Examples shown in the generated references (docs/cli.md, docs/api.md). Each is ``(command, why not run)``:
tests/test_docs.py runs every example whose reason is None on the sample index (``indexes/sample``, built from
``samples/corpus.jsonl``) and requires a reason for the others."""

from __future__ import annotations

SERVER = "needs a running `routerag serve` (tests/test_quickstart.py serves the sample index)"
POLICY = "runs the policy model (30-60 s on 2 CPU cores; tests/test_quickstart.py runs one)"
LONG = "a long-running server"
TRAIN = "trains a model (minutes to hours; tests/test_training.py runs the smoke preset)"

#: Command path → examples.
CLI_EXAMPLES: dict[str, list[tuple[str, str | None]]] = {
    "routerag": [("routerag --version", None)],
    "routerag build-graph": [("routerag build-graph samples/corpus.jsonl --out indexes/sample --force", None)],
    "routerag info": [("routerag info indexes/sample --verify", None)],
    "routerag search": [
        ('routerag search indexes/sample "Who paid for the opera house where The Glass Lighthouse premiered?" '
         "--mode graph -k 3", None),
        ('routerag search indexes/sample "Lindqvist copper" --mode hybrid -k 2 --json', None)],
    "routerag ask": [('routerag ask indexes/sample "Who wrote the libretto of The Glass Lighthouse?" --budget 2',
                      POLICY)],
    "routerag serve": [("routerag serve indexes/sample --port 8000", LONG)],
    "routerag mcp": [("routerag mcp indexes/sample", LONG)],
    "routerag eval": [("routerag eval indexes/sample --questions samples/questions.jsonl --modes learned,naive-hybrid "
                       "--out reports/sample", POLICY)],
    "routerag train": [("routerag train --stage 1 --engine local --model tiny-random --steps 2 --out runs/smoke", TRAIN)],
    "routerag train-sft": [("routerag train-sft --index indexes/sample --questions samples/questions.jsonl "
                            "--out runs/sft", TRAIN)],
    "routerag plan-outcomes": [("ROUTERAG_POLICY__READER=extractive routerag plan-outcomes indexes/sample --questions "
                                "samples/questions.jsonl --out reports/outcomes.jsonl",
                                "reads every candidate plan of every question (seconds a question on 2 CPU cores)")],
    "routerag prepare-data": [("routerag prepare-data samples/questions.jsonl --out data/sample", None)],
    "routerag merge-adapter": [("routerag merge-adapter --adapter runs/sft/adapter --out models/merged", TRAIN)],
    "routerag index add": [("routerag index add indexes/sample samples/more.jsonl", None)],
}

#: HTTP examples for docs/api.md: route → a curl command against a local server with an API key in $KEY.
API_EXAMPLES: dict[str, str] = {
    "POST /ask": """curl -s http://127.0.0.1:8000/ask -H "Authorization: Bearer $KEY" \\
  -H 'Content-Type: application/json' -d '{"question": "Who wrote the libretto of The Glass Lighthouse?"}'""",
    "POST /retrieve": """curl -s http://127.0.0.1:8000/retrieve -H "Authorization: Bearer $KEY" \\
  -H 'Content-Type: application/json' -d '{"queries": ["Glass Lighthouse premiere"], "mode": "hybrid", "topk": 3}'""",
    "GET /documents": "curl -s 'http://127.0.0.1:8000/documents?index=sample&q=lighthouse&limit=5' \\\n"
                      '  -H "Authorization: Bearer $KEY"',
    "POST /documents": """curl -s 'http://127.0.0.1:8000/documents?index=sample' -H "Authorization: Bearer $KEY" \\
  -H 'Content-Type: application/x-ndjson' --data-binary @samples/more.jsonl""",
    "POST /v1/chat/completions": """curl -s http://127.0.0.1:8000/v1/chat/completions -H "Authorization: Bearer $KEY" \\
  -H 'Content-Type: application/json' \\
  -d '{"model": "sample", "messages": [{"role": "user", "content": "Who founded the Halvard Opera House?"}]}'""",
    "GET /health": "curl -s http://127.0.0.1:8000/health",
}
