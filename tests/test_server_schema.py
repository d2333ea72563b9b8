"""Property-based API testing with schemathesis against the app's own OpenAPI schema: valid and invalid requests to
every operation, with and without an API key, must never produce a server error."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from graph_index.builder import Components
from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, build_small_index

EXAMPLES = 12


@pytest.fixture(scope="module")
def own_index(tmp_path_factory, minilm, spacy_extractor) -> Path:
    """An index of this module's own: generated uploads may add documents to it."""
    return build_small_index(tmp_path_factory.mktemp("schema") / "idx", minilm, spacy_extractor)


@pytest.mark.parametrize("api_key", [None, "schema-key"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_no_server_errors(own_index: Path, minilm, spacy_extractor, api_key: str | None,
                          mode: GenerationMode) -> None:
    # small limits keep generated requests cheap (each /retrieve query is embedded for real)
    cfg = Settings(cache_dir=own_index.parent / "cache",
                   server={"api_key": api_key, "max_question_chars": 300, "max_queries": 4, "max_k": 5,
                           "request_timeout_s": 30, "allowed_hosts": ["testserver"]})  # schemathesis's ASGI host
    retriever = Retriever(own_index, cfg.retrieval, embedder=minilm)
    app = create_app(Engine(own_index, cfg, generator=RoutingPolicy(), retriever=retriever), cfg,
                     components={"idx": Components(cfg, embedder=minilm, extractor=spacy_extractor)})
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    seen: dict[str, set[int]] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /ask", "POST /retrieve", "GET /health", "GET /metrics",
                                               "POST /documents", "DELETE /documents/{doc_id}", "GET /jobs/{job_id}",
                                               "POST /v1/chat/completions", "GET /v1/models", "GET /indexes",
                                               "POST /explain"}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and not len(op.body):
            continue  # nothing to get wrong in a GET without parameters
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case) -> None:
            response = case.call(headers=headers)
            seen.setdefault(op.label, set()).add(response.status_code)
            case.validate_response(response, checks=[not_a_server_error])

        run()
    statuses = set().union(*seen.values())
    assert all(s < 500 for s in statuses), seen
    if mode is GenerationMode.POSITIVE:
        assert 200 in seen["POST /ask"] and 200 in seen["POST /retrieve"] and 200 in seen["POST /explain"], seen
