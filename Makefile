# The two commands a new user types:   make demo   and   make test
# Both create .venv on first use. torch comes first, pinned, because a bare `torch` requirement pulls the CUDA
# build (gigabytes); on these machines torch==2.13.0 is a local CPU wheel. Elsewhere, point TORCH_INDEX at
# https://download.pytorch.org/whl/cpu (or any torch you like: the package accepts torch>=2.2).

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
BIN         := $(VENV)/bin
STAMP       := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
SAMPLE_IDX  ?= indexes/sample

.PHONY: install demo test bench-build clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

DEMO_QUESTION ?= In which city was the composer of The Glass Lighthouse born?

demo: install
	$(BIN)/routerag build-graph samples/corpus.jsonl --out $(SAMPLE_IDX) --force
	$(BIN)/routerag search $(SAMPLE_IDX) "$(DEMO_QUESTION)" --mode hybrid -k 3

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) indexes
