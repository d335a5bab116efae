# locvit: the README's two commands are `make demo` and `make test`.
# Both set up .venv first (system libraries for FFCV included); a second run skips
# what is already installed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# FFCV builds against OpenCV and libjpeg-turbo found through pkg-config.
SYSTEM_PACKAGES := pkg-config libopencv-dev libturbojpeg0-dev
# `make test`: the browser tests (MLflow UI, DVC plots) drive Debian's Chromium; where apt has no `chromium`
# (Ubuntu ships it as a snap) or make is not root, they skip and say so.
BROWSER_PACKAGES := chromium
# `make test-cluster`: a two-node SLURM cluster with accounting, each node in a network namespace of its
# own (tests/slurm_cluster.py: iproute2's ip, util-linux's nsenter and unshare).
CLUSTER_PACKAGES := slurm-wlm slurmdbd munge mariadb-server iproute2 util-linux
STAMP := $(VENV)/.locvit-installed
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install system-deps browser-deps cluster-deps demo test test-fast test-floor test-cluster lint lock bench sweep efficiency clean

install: $(STAMP)
	@$(BIN)/python -c "$$VENV_HERE"

# A .venv copied or moved here from another checkout runs that checkout's code (its editable locvit and its
# scripts' interpreter stay there): install, and every target after it, says so and stops.
define VENV_HERE
import importlib.util, pathlib, sys
here, venv_bin = pathlib.Path.cwd(), pathlib.Path("$(BIN)").resolve()
spec = importlib.util.find_spec("locvit")
origin = pathlib.Path(spec.origin).resolve().parent if spec and spec.origin else None
script = venv_bin / "locvit"
shebang = script.read_text().splitlines()[0][2:].strip() if script.is_file() else ""
wrong = [] if origin == (here / "src" / "locvit").resolve() else [f"its locvit is {origin or 'not installed'}"]
wrong += [] if shebang and pathlib.Path(shebang).parent.resolve() == venv_bin else [f"its scripts run {shebang or 'nothing'}"]
if wrong:
    sys.exit(f"make: $(VENV) was made for another checkout ({'; '.join(wrong)}), not {here}; run: rm -rf $(VENV) && make install")
endef
export VENV_HERE

# $(call apt_deps,<packages>,<variable holding the commands to run when they cannot be installed>):
# install the missing ones with apt-get as root, else run the fallback ($$missing names them).
define apt_deps
missing=""; for p in $(1); do \
  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
    echo "installing system packages:$$missing"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
  else \
    $($(2)); \
  fi; \
fi
endef
SYSTEM_DEPS_MISSING = echo "FFCV needs system packages that are missing. Run, as root:"; \
  echo "  apt-get update && apt-get install -y$$missing"; echo "then run make again."; exit 1
BROWSER_DEPS_MISSING = echo "the browser tests need:$$missing (as root: apt-get install -y$$missing); they will skip"
CLUSTER_DEPS_MISSING = echo "the SLURM test cluster needs:$$missing (as root: apt-get install -y$$missing); the test will skip"

system-deps:
	@$(call apt_deps,$(SYSTEM_PACKAGES),SYSTEM_DEPS_MISSING)

browser-deps:
	@( $(call apt_deps,$(BROWSER_PACKAGES),BROWSER_DEPS_MISSING) ) || echo "apt-get could not install$(BROWSER_PACKAGES:%= %): the browser tests will skip"

$(STAMP): pyproject.toml constraints.txt
	@$(MAKE) --no-print-directory system-deps
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]' -c constraints.txt
	@touch $@

# constraints.txt: this venv's exact versions, the reproducible set (run after changing pyproject.toml on purpose)
lock: install
	{ echo "# The exact versions make install uses (pip install -c): the reproducible set, updated on purpose with make lock."; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -v '^locvit'; } > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt

demo: install
	$(BIN)/locvit validate
	$(BIN)/snakemake --cores all all
	@$(BIN)/locvit results

# The recipe sweep that chose the demo's recipe, and the data-efficiency study; each copies its
# measured table and figure into docs/ (docs/recipe.md and docs/data_efficiency.md discuss them).
sweep: install
	$(BIN)/snakemake --cores all all --config params=presets/recipe_sweep.yaml
	$(call publish,recipe_sweep,recipe,figures/curves.png)

# `make efficiency` runs the preset (the anchors' protocol, same_images); `make efficiency PROTOCOL=same_epochs` the
# same study at the recipe's epochs (doctools/efficiency_preset.py writes that params file), into the same
# folder, so the full-data runs, the same under both, train once; the fraction runs below 1 differ, so each switch
# of PROTOCOL retrains them over the other protocol's (docs/data_efficiency/<protocol>/ keeps each one's tables).
PROTOCOL ?= same_images
EFFICIENCY_PARAMS = $(if $(filter same_images,$(PROTOCOL)),presets/data_efficiency.yaml,results/data_efficiency_$(PROTOCOL).yaml)
efficiency: install
	$(if $(filter same_images,$(PROTOCOL)),,$(BIN)/python -m doctools.efficiency_preset $(PROTOCOL) $(EFFICIENCY_PARAMS))
	$(BIN)/snakemake --cores all all --config params=$(EFFICIENCY_PARAMS)
	$(call publish,data_efficiency,data_efficiency/$(PROTOCOL),figures/accuracy_vs_fraction.png tables/data_efficiency.csv)

# $(call publish,<study>,<docs folder>,<more report files>): the study's results and throughput as CSV (the docs
# render their tables from them) and the files named (doctools/publish.py)
define publish
$(BIN)/python -m doctools.publish results/$(1)/report docs/$(2) results.csv results_seeds.csv evaluations.json throughput.csv $(3)
$(BIN)/python -m doctools.doc_tables
endef

# The suite but the cluster test, in two lanes: first the fast lane (`make test-fast`: every test that starts no
# process, tests/conftest.py fails one that starts a process without the e2e marker), then the rest; each lane's
# counts and wall time go to test-artifacts/durations.json (ignored by git: a test run leaves the tree clean).
# Both lanes run on WORKERS pytest-xdist processes; the rest lane keeps a file's tests on one worker (loadfile;
# tests/conftest.py puts the two files of plugin_study on one), so a study is built once.
FAST_LANE := not e2e and not cluster and not cuda
REST_LANE := (e2e or cuda) and not cluster
WORKERS ?= auto

test: install
	@$(MAKE) --no-print-directory browser-deps
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "$(FAST_LANE)" -n $(WORKERS) --record-lane fast
	$(BIN)/python -m pytest -q -m "$(REST_LANE)" -n $(WORKERS) --dist loadfile --record-lane rest

test-fast: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "$(FAST_LANE)" -n $(WORKERS)

# The floor lane: the fast lane in a second environment (.venv-floor, CPython 3.12 as on the GPU node) holding the
# oldest versions pyproject.toml's ranges allow (constraints-floor.txt: torch 2.11 and the other floors).
# No pip cache: CI holds three venvs with CUDA wheels on one disk (gpu_node/link_torch.py shares one of them).
FLOOR_VENV := .venv-floor
FLOOR_PYTHON ?= $(shell for p in $$(command -v python3.12) $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
  "$$p" -c '' 2>/dev/null && echo "$$p" && break; done)

$(FLOOR_VENV)/.installed: pyproject.toml constraints-floor.txt
	@$(MAKE) --no-print-directory system-deps
	@test -n "$(FLOOR_PYTHON)" || { echo "the floor lane needs CPython 3.12 (python3.12 on PATH or pyenv's)"; exit 1; }
	@test -x $(FLOOR_VENV)/bin/python || $(FLOOR_PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install -q --no-cache-dir -e '.[test]' -c constraints-floor.txt
	@touch $@

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -m pytest -q -m "$(FAST_LANE)" -n $(WORKERS) -p no:cacheprovider

# `snakemake --profile cluster all` through a real SLURM brought up on this machine (root
# and apt-get needed: elsewhere the test skips and says why).
test-cluster: install
	@$(MAKE) --no-print-directory cluster-deps
	LOCVIT_CLUSTER_TEST=1 $(BIN)/python -m pytest -q -m cluster tests/test_cluster.py

cluster-deps:
	@$(call apt_deps,$(CLUSTER_PACKAGES),CLUSTER_DEPS_MISSING)

# ruff's rules are listed in pyproject.toml; `ruff format .` and `ruff check --fix .` repair most of what it finds
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakemake --lint

# Speed comparisons, measured as ratios side by side; results in benchmarks/results/*.json.
# bench_pipeline times snakemake -n / dvc status on the finished demo, and the demo from scratch in a copy.
BENCHES := mait ibit lsa loader augment dataloader feed tracking
bench: demo
	set -e; for b in $(BENCHES); do $(BIN)/python -m benchmarks.bench_$$b; done
	$(BIN)/python -m benchmarks.bench_pipeline --demo

# The GPU node's tools (the wheelhouse, the first visit) have their own Makefile: gpu_node/README.md.

clean:
	rm -rf results .snakemake
