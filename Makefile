# The commands of the README:  make run  (set up + default job), make test (the suite but its
# slow end-to-end tests) and make test-slow (those); CI (.ci/run) runs both test targets.
.PHONY: setup run test test-slow lint

setup:
	bash scripts/setup.sh

run: setup
	bash scripts/run_default.sh

PYTEST = PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest -q --dist worksteal

# Every test not marked slow: the core, the server loops on the in-process grid, the ClientApps.
test: setup
	$(PYTEST) -n 4 -m "not slow" tests

# The tests marked slow (pytest.mark.slow): Flower's Simulation Engine and SuperLink + SuperNodes
# on loopback started as processes, the README's quick start run as written. One at a time:
# each starts many processes (SuperLink, SuperNodes, a ClientApp per message, Ray), and beside
# another on 2 cores Flower's and Ray's fixed start-up limits were missed (a raylet's 30 s to
# register). With more workers, tests that start a Ray cluster still take turns
# (pytest.mark.exclusive("ray")). The 20 longest are listed.
test-slow: setup
	$(PYTEST) -n 1 -m slow --durations=20 tests

lint:
	.venv/bin/ruff check .
