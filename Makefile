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
# on loopback started as processes, the README's quick start run as written. Each starts many
# processes (SuperLink, SuperNodes, a ClientApp per message, Ray), so 2 workers for 2 cores, and
# those that start a Ray cluster take turns (pytest.mark.exclusive("ray")): Ray gives a raylet a
# fixed 30 s to register, which a loaded machine misses. The 20 longest are listed.
test-slow: setup
	$(PYTEST) -n 2 -m slow --durations=20 tests

lint:
	.venv/bin/ruff check .
