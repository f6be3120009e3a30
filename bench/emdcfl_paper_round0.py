"""EMD-CFL's one-shot clustering at paper 001's Table 1 sizes, without Flower: round 0 of local
training and the clustering step of the ``paper`` preset (Rotated MNIST ``max``, 40 clients ×
5,420 images, the 64/128-channel CNN, 10 local epochs), over in-memory clients, with
``emdcfl.epsilon="auto"`` unless ``--epsilon`` is given; prints the ε the run chose, the gap it
saw and the ARI of the clusters against the rotation groups.

    python bench/emdcfl_paper_round0.py --data-dir "$FEDCLUST_DATA_DIR" --seed 0      # GPU
    nice -n 10 python bench/emdcfl_paper_round0.py --data-dir "$FEDCLUST_DATA_DIR" \\
        --round0-epochs 1 --device cpu                        # the CPU check: fewer epochs

The clustering only depends on the round-0 models, so ``emdcfl.rounds=1`` gives the clusters
(and the ARI) of the full preset; accuracies of later rounds are not measured here. The same
run through Flower: ``python -m server_app.emdcfl_experiments run --preset paper --seeds 0
--set emdcfl.rounds=1``. ``--out`` keeps the excess and distance matrices (``.npz``) and the
summary (``.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help="folder holding mnist/mnist-*.npz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--epsilon", default="auto", help='"auto" (default) or a number')
    ap.add_argument("--round0-epochs", type=int, default=0,
                    help="local epochs of round 0 (0: the preset's 10)")
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="processes solving the EMDs")
    ap.add_argument("--full-matrix", action="store_true",
                    help="solve every direction (the full matrices for heatmaps and ε sweeps)")
    ap.add_argument("--out", default="", help="folder for the matrices and the summary")
    a = ap.parse_args(argv)

    from fedclust.config import validate
    from fedclust.emdcfl import inmemory, loop
    from fedclust.emdcfl.keys import EMDCFLSettings
    from fedclust.results import MemoryRecord
    from server_app.emdcfl_experiments import PAPER

    cfg = {**PAPER, "method": "emdcfl", "dataset": "rotmnist", "emdcfl.rotation": "max",
           "num-clients": a.clients, "seed": a.seed, "data-dir": a.data_dir,
           "emdcfl.rounds": 1, "emdcfl.device": a.device, "emdcfl.epsilon": a.epsilon,
           "emdcfl.round0-epochs": a.round0_epochs, "emdcfl.workers": a.workers,
           "emdcfl.full-matrix": a.full_matrix, "evaluate": True, "plots": False}
    s = EMDCFLSettings.from_config(validate(cfg))
    import torch

    device = "cuda" if s.device == "auto" and torch.cuda.is_available() else s.device
    print(f"EMD-CFL paper preset, round 0 + clustering: {a.clients} clients x "
          f"{s.samples} images, CNN {s.conv1}/{s.conv2}/{s.embed_dim}, "
          f"{s.epochs(0)} local epochs, lr {s.lr}, batch {s.batch_size}, seed {s.seed}, "
          f"epsilon {s.epsilon}, device {device}"
          + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""), flush=True)
    t0 = time.perf_counter()
    clients = inmemory.InMemoryClients.simulated(s, a.clients)
    record = MemoryRecord()
    metrics = loop.run(clients, s, record)
    wall = time.perf_counter() - t0
    h = record.history[0]
    print(f"train {metrics['training_s']:.1f} s, embed {h['embed_s']:.1f} s, EMD "
          f"{h['emd_s']:.1f} s ({h['emd_solves']} solves, {h['emd_skipped']} skipped), "
          f"evaluation {metrics['evaluation_s']:.1f} s, total {wall:.1f} s")
    gap = h.get("epsilon_gap")
    print(f"epsilon {h['epsilon']} (rule {h['epsilon_rule']}, gap "
          f"{'none' if gap is None else f'[{gap[0]:.4f}, {gap[1]:.4f}]'}, clearness "
          f"{h.get('epsilon_gap_clearness')}, cap {h.get('epsilon_cap')})")
    for text in metrics.get("warnings", []):
        print(f"WARNING: {text}")
    print(f"clusters {metrics['num_clusters']}: {metrics['clusters']}")
    print(f"truth     {metrics['eval_truth']}")
    print(f"ARI {metrics['eval_ari']:.4f}   mean test accuracy after round 0 "
          f"{metrics['eval_acc_mean']:.4f}")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = f"paper-round0-s{a.seed}-e{s.epochs(0)}"
        np.savez_compressed(out / f"{tag}.npz", excess=record.arrays["emd_excess"],
                            emd=record.arrays["emd_matrix"],
                            truth=np.array(metrics["eval_truth"]),
                            clusters=record.arrays["clusters"])
        keep = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
        (out / f"{tag}.json").write_text(json.dumps(
            {"config": {k: v for k, v in cfg.items()}, "device": device, "wall_s": wall,
             "history": record.history, "metrics": keep}, indent=1, default=str))
        print(f"wrote {out / tag}.npz and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
