#!/usr/bin/env bash
# Run the default job with `flwr run .` on Flower's Simulation Engine and check the run status
# (`flwr run --stream` exits 0 even when a run fails). Extra arguments go to --run-config.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Results: $OUT if set, else a new folder under ~/fedclust-runs (as every other launcher).
OUT=${OUT:-}
python - "$OUT" "$@" <<'PY'
import re
import sys
from server_app.engine import SimulationSuperLink
out, extra = sys.argv[1], sys.argv[2:]
cfg = {"output-dir": out} if out else {}
for item in extra:
    k, _, v = item.partition("=")
    cfg[k] = v
from fedclust.data.sites import simulated_nodes
from fedclust.errors import BadInputError
from server_app.app import check_run_config
try:   # bad input stops here, with the run config's message, before any SuperLink starts
    n = simulated_nodes(cfg, 5)
    check_run_config({**cfg, "num-clients": n})
except BadInputError as exc:
    print(f"run_default.sh: {exc}", file=sys.stderr)
    sys.exit(2)
with SimulationSuperLink() as link:
    res = link.run(cfg, num_supernodes=n)
print(res.log)
written = re.findall(r"results written to (\S+)", res.log)
out = out or (written[-1] if written else "~/fedclust-runs")
print(f"run {res.run_id}: {res.status} in {res.seconds:.1f}s; results in {out}")
sys.exit(0 if res.ok else 1)
PY
