"""Cold start of the fedclust ClientApp against Flower's own, in the same run.

Every deployment message starts a fresh ClientApp process, so its import time is paid per
message. Two pairs are timed, alternating A/B in each repetition so that load changes hit both:

1. ``import client_apps.app`` vs ``import flwr.clientapp`` (target ratio ≤ 1.5);
2. a fresh process that imports the app and answers one exact-FCM ``query.fcm_sums`` message
   from a node-owned ``.npz`` (what a deployed node does per round) vs a fresh process that
   imports ``flwr.clientapp`` and answers one message with a no-op ClientApp.

    python bench/bench_clientapp_start.py [--reps 7]

Prints the median seconds of each and their ratio, and the load average.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, load_average, parser, ratio, seconds

ONE_MESSAGE = """
import sys
import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
{app_import}
ctx = Context(run_id=1, node_id=1, node_config={{"data-path": sys.argv[1]}}, state=RecordDict(),
              run_config={{"dataset": "local", "num-clients": 3, "plots": False}})
content = RecordDict({{"centers": ArrayRecord({{"centers": Array(np.zeros((4, 8)))}}),
                      "scaling": ArrayRecord({{"shift": Array(np.zeros(8)),
                                              "scale": Array(np.ones(8))}})}})
msg = Message(content, dst_node_id=1, message_type="query.fcm_sums")
msg.metadata.__dict__["_message_id"] = "m"
reply = app(msg, ctx)
assert not reply.has_error(), reply.error
"""
FEDCLUST = "from client_apps.app import app"
NOOP = """from flwr.clientapp import ClientApp
app = ClientApp()
@app.query("fcm_sums")
def noop(msg, context):
    return Message(RecordDict(), reply_to=msg)"""


def run_seconds(args: list[str]) -> float:
    return seconds(lambda: subprocess.run([sys.executable, *args], cwd=ROOT, check=True,
                                          capture_output=True))[0]


def pair(name: str, a: list[str], b: list[str], reps: int) -> float:
    ta, tb = [], []
    for _ in range(reps):
        ta.append(run_seconds(a))
        tb.append(run_seconds(b))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{name}: fedclust {ma:.3f} s, flower {mb:.3f} s (medians of {reps}), "
          f"ratio {ratio(ma, mb)}")
    return ma / mb


def main() -> None:
    ap = parser(repeats=7, repeats_flag="--reps")
    args = ap.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "node.npz"
        np.savez(data, x=np.random.default_rng(0).normal(size=(2000, 8)))
        print(f"load average {load_average():.2f}")
        pair("import", ["-c", "import client_apps.app"], ["-c", "import flwr.clientapp"],
             args.reps)
        pair("one message in a fresh process",
             ["-c", ONE_MESSAGE.format(app_import=FEDCLUST), str(data)],
             ["-c", ONE_MESSAGE.format(app_import=NOOP), str(data)], args.reps)
        print(f"load average {load_average():.2f}")


if __name__ == "__main__":
    main()
