"""Turn Hydra multirun directories into the papers' tables (markdown).

``python -m fedclust.experiments <table> <multirun-dir> [...]`` reads every job's
``summary.json`` (and arrays) and prints the table. Centralized references (pooled data) are
computed here, after the fact, on the evaluation side — never inside a federated run.
"""
