# gpuplatform: `make run` starts the platform, `make test` runs every check. See README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
export HOST PORT

.PHONY: run setup test lint bench clean stop-db help messages chromium gpu-check

help:
	@echo "make run    set up everything and start web, scheduler and node agent (Ctrl-C stops)"
	@echo "make test   set up everything and run lint, Django checks and the test suite"
	@echo "make bench  print the benchmark figures"

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "gpuplatform needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .   # the gpuctl command, as .venv/bin/gpuctl
	touch $(STAMP)

# The secret key of a local installation, made once and kept out of git (var/ is ignored).
var/secret_key:
	@mkdir -p var && umask 077 && $(BIN)/python -c \
		'import secrets; print(secrets.token_urlsafe(50))' > var/secret_key

# The interface's translations (locale/*/LC_MESSAGES/django.po) compiled for gettext; msgfmt
# comes from Debian's gettext package, installed here when missing and run as root.
# (msgfmt itself, not manage.py compilemessages: no settings, secret or database needed.)
messages:
	@command -v msgfmt >/dev/null || { [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q gettext >/dev/null; } || \
		{ echo "compiling translations needs msgfmt: apt-get install gettext"; exit 1; }
	@for po in locale/*/LC_MESSAGES/*.po; do \
		msgfmt --check-format -o "$${po%.po}.mo" "$$po" || exit 1; done

# The browser tests drive Debian's Chromium through Playwright (`playwright install` cannot
# download browsers everywhere), with CJK fonts so the Chinese pages render as people see them.
# Installed when missing and possible (root, apt-get); otherwise those tests skip and say why.
BROWSER_PACKAGES := chromium fonts-noto-cjk
chromium:
	@if [ -x /usr/bin/chromium ] && dpkg -s fonts-noto-cjk >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y $(BROWSER_PACKAGES) || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(BROWSER_PACKAGES); }; \
	else echo "chromium: /usr/bin/chromium missing and not installable here (needs root and" \
		"apt-get): browser tests will skip"; fi

# The task exec helper (nodeagent/launcher/gpup_exec.c, TASK_EXEC_HELPER in
# docs/configuration.md): a small static C program that takes a task's process from the
# supervisor's vfork to its command. Built with Debian's gcc, installed here when missing and
# possible (root, apt-get). Without a compiler supervisors do that step in Python, at more CPU
# per task, and log that they do.
HELPER := $(BIN)/gpup-exec
$(HELPER): nodeagent/launcher/gpup_exec.c $(STAMP)
	@command -v cc >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc libc6-dev >/dev/null; } || true
	@if command -v cc >/dev/null; then \
		cc -O2 -Wall -Wextra -Werror -static -o $@ $< 2>/dev/null || \
		cc -O2 -Wall -Wextra -Werror -o $@ $<; \
	else echo "gpup-exec: no C compiler (apt-get install gcc libc6-dev): tasks start through" \
		"Python, slower"; fi

setup: $(STAMP) $(HELPER) var/secret_key messages chromium
	SECRET_KEY_FILE=var/secret_key $(BIN)/python manage.py migrate --noinput
	SECRET_KEY_FILE=var/secret_key $(BIN)/python manage.py createcachetable
	SECRET_KEY_FILE=var/secret_key $(BIN)/python manage.py collectstatic --noinput -v 0
	SECRET_KEY_FILE=var/secret_key $(BIN)/python manage.py bootstrap

run: setup
	SECRET_KEY_FILE=var/secret_key SECURE_COOKIES=$${SECURE_COOKIES:-0} \
		exec $(BIN)/python scripts/run.py

# ruff, then the import contracts in pyproject.toml ([tool.importlinter]: the layers).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

# Each checkout tests in databases of its own (scripts/database_url.py --checkout), dropped at
# the end however the run ends, so two checkouts can run `make test` at once on one host.
test: lint $(HELPER) messages chromium
	@GPUPLATFORM_TESTING=1 $(BIN)/python scripts/database_url.py --checkout gpuplatform -- \
		bash -c '$(BIN)/python manage.py check --fail-level WARNING && \
		$(BIN)/python manage.py makemigrations --check --dry-run && \
		$(BIN)/pytest'

# On a host with NVIDIA GPUs (stop `make run` first): the NVML tests on the real GPUs, then two
# one-GPU CUDA tasks through the running platform (TASK_PYTHON: their interpreter, see
# docs/configuration.md).
gpu-check: setup
	SECRET_KEY_FILE=var/secret_key PYTHON=$(BIN)/python bash scripts/gpu_check.sh

bench: $(STAMP) $(HELPER)
	@url="$$($(BIN)/python scripts/database_url.py gpuplatform_bench)"; \
	if [ -n "$$url" ]; then export DATABASE_URL="$$url"; else unset DATABASE_URL; fi; \
	GPUPLATFORM_TESTING=1 $(BIN)/python bench/run.py

stop-db: $(STAMP)
	$(BIN)/python -c 'from pathlib import Path; from gpuplatform.embedded_db import \
		stop_embedded_database as s; print("stopped" if s(Path("var")) else "not running")'

clean:
	rm -rf $(VENV)
