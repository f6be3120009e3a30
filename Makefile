# The two commands of the README:  make run  (set up + default job)  and  make test.
.PHONY: setup run test lint

setup:
	bash scripts/setup.sh

run: setup
	bash scripts/run_default.sh

test: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/python -m pytest -q tests

lint:
	.venv/bin/ruff check .
