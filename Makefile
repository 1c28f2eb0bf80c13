# Two entry points for a fresh clone (see README): `make demo` and `make test`.
# Each creates .venv when it is missing and installs exactly what it needs. torch is pinned through
# constraints.txt: an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
PIPC := $(PIP) install -c constraints.txt

.PHONY: test test-slow test-all test-metaworld test-jax demo bench lint typecheck docs package clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# stamp files: reinstall when the package metadata or the pins change
$(VENV)/.stamp-test: pyproject.toml constraints.txt | $(PY)
	$(PIPC) -e ".[test]"
	touch $@

$(VENV)/.stamp-typecheck: pyproject.toml constraints.txt | $(PY)
	$(PIPC) -e ".[typecheck]"
	touch $@

$(VENV)/.stamp-docs: pyproject.toml constraints.txt | $(PY)
	$(PIPC) -e ".[docs]"
	touch $@

# (export, video: `relive export --format onnx|safetensors` and `relive eval --video`, which the README shows)
$(VENV)/.stamp-demo: pyproject.toml constraints.txt | $(PY)
	$(PIPC) -e ".[train,experiments,export,video]"
	touch $@

$(VENV)/.stamp-bench: pyproject.toml constraints.txt | $(PY)
	$(PIPC) -e ".[train,bench,experiments]"
	touch $@

# Meta-World (PLD's manipulation grid, relive.metaworld_envs) in a venv of its own: metaworld 3.1.1 pins
# mujoco 3.3.0, the main venv has mujoco 4
MWVENV ?= .venv-metaworld
$(MWVENV)/.stamp: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(MWVENV)
	$(MWVENV)/bin/pip -q --disable-pip-version-check install -c constraints.txt -e ".[metaworld]"
	touch $@

test-metaworld: $(MWVENV)/.stamp
	$(MWVENV)/bin/python -m pytest tests/metaworld

# JAX learners (issue 49: Batch.to_jax, sbx with relive's buffer, the Flax example) in a venv of their own: the extra
# "jax" is ~550 MB, so the main test venv does without it and skips these tests
JAXVENV ?= .venv-jax
$(JAXVENV)/.stamp: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(JAXVENV)
	$(JAXVENV)/bin/pip -q --disable-pip-version-check install -c constraints.txt -e ".[jax,sb3]" "pytest>=7" \
		"hypothesis>=6.80" "gymnasium>=1.0"
	touch $@

test-jax: $(JAXVENV)/.stamp
	$(JAXVENV)/bin/python -m pytest tests/test_jax.py tests/test_jax_examples.py tests/integrations/test_sbx.py

# lint-imports: the floors of pyproject.toml's [tool.importlinter] (imports point down, no cycles; docs/extending.md)
# The default suite runs on every core (pytest-xdist; each worker one torch thread: tests/conftest.py) and stays
# within 5 minutes on a 2-core machine; tests over ~5 s there are marked slow and run by `make test-slow` (CI runs both: .ci/run)
test: $(VENV)/.stamp-test
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check src tests bench examples
	$(PY) -m pytest -m "not slow" -n auto

test-slow: $(VENV)/.stamp-test
	$(PY) -m pytest -m slow -n auto

test-all: $(VENV)/.stamp-test
	$(PY) -m pytest -n auto

demo: $(VENV)/.stamp-demo
	$(VENV)/bin/relive demo --out runs/demo

bench: $(VENV)/.stamp-bench
	$(PY) bench/replay_throughput.py --rows 1000000 --seconds 2 --out docs/img

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check src tests bench examples

# mypy over src/relive (pyproject.toml's [tool.mypy]: files, less exclude; issue 48 item 6)
typecheck: $(VENV)/.stamp-typecheck
	$(VENV)/bin/mypy

# the API reference site (mkdocs.yml: docs/*.md + mkdocstrings from the docstrings) into site/; --strict: a broken
# link or a missing reference fails the build
docs: $(VENV)/.stamp-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # (the variable: no mkdocs-material end-of-life banner)

# the package as users get it: wheel + sdist built, the wheel installed into a new venv and used from outside the
# checkout (CLI, API, a tiny training run, a buffer save/load); no setuptools deprecation warning allowed
package: $(VENV)/.stamp-test
	.ci/package_smoke.sh $(PY)

clean:
	rm -rf $(VENV) $(JAXVENV) .pytest_cache .hypothesis .mypy_cache dist build site
