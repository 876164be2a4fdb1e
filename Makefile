# The two commands a fresh machine needs: `make sweep` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
INFRA_VENV ?= .venv-infra
INFRA_STAMP := $(INFRA_VENV)/.installed-stamp

.PHONY: install browser sweep test test-fast infra-check lint bench clean

# One pip command, as the stack notes say: installing in steps lets later packages
# downgrade pyarrow / python-dateutil. torch stays pinned in pyproject.toml (CPU wheel).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	DS_BUILD_OPS=0 $(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# checkov lives in its own venv: its pins (boto3, pydantic, ...) must not move the project's.
$(INFRA_STAMP):
	test -x $(INFRA_VENV)/bin/python || $(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/pip install -q --disable-pip-version-check checkov==3.3.30
	touch $(INFRA_STAMP)

# headless Chromium (Debian's package) for the test that reads the MLflow UI's version page; where apt cannot
# install it, that check skips and says so
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { timeout 300 apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
	      --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium not installed: the MLflow UI check of tests/e2e/test_sweep.py will skip"

install: $(STAMP) $(INFRA_STAMP) browser

sweep: $(STAMP)  # the project alone: checkov's venv is for the infra tests
	$(PY) jobs/sifter_sweep.py --preset smoke $(ARGS)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# the inner loop: no Ray cluster, no server, no slow end-to-end run (CI runs everything: `make test`)
test-fast: install
	$(PY) -m pytest -m "not slow and not services" $(PYTEST_ARGS)

# the AWS root applied and destroyed against moto's server on loopback (about 3-4 minutes; needs terraform and
# the aws provider in the offline mirror, SIEVE_TF_MIRROR, default /opt/tf-plugins)
infra-check: $(STAMP)
	SIEVE_INFRA_CHECK=1 $(PY) -m pytest -m infra_check -s tests/infra/test_emulated_apply.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf outputs mlruns .pytest_cache
