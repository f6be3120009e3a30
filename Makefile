# The two commands of the README:  make run  (set up + default job)  and  make test.
.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	bash scripts/run_default.sh

# 4 workers on 2 cores: the slow tests (Flower engines, SuperLink + SuperNodes on loopback) mostly
# wait on Flower's polling and process start-up, not on the CPU.
test: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest -q -n 4 --dist worksteal tests

lint:
	.venv/bin/ruff check .
