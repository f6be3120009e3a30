# The commands of the README:  make run  (set up + default job), make test (the suite but its
# slow end-to-end tests) and make test-slow (those); CI (.ci/run) runs both test targets.
.PHONY: setup run test test-slow lint

setup:
	bash scripts/setup.sh

run: setup
	bash scripts/run_default.sh

PYTEST = PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest -q -n 4 --dist worksteal

# Every test not marked slow: the core, the server loops on the in-process grid, the ClientApps.
test: setup
	$(PYTEST) -m "not slow" tests

# The tests marked slow (pytest.mark.slow): Flower's Simulation Engine and SuperLink + SuperNodes
# on loopback started as processes, the README's quick start run as written. 4 workers on 2
# cores: they mostly wait on Flower's polling and process start-up, not on the CPU; those that
# start a Ray cluster take turns (pytest.mark.exclusive("ray")). The 20 longest are listed.
test-slow: setup
	$(PYTEST) -m slow --durations=20 tests

lint:
	.venv/bin/ruff check .
