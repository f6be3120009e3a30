"""Backdoor MNIST diagnostic: does a label-shaded model use the colour?

One client of the label-shaded (backdoor) set trains the shared initial model for round 0 as
in a ``cpu-backdoor`` run (8/16-channel CNN, 2 epochs, lr 0.01, 4 878 train images). Its test
digits are then evaluated twice: shaded by their own label, as in training, and re-shaded with
the colour of label ``9 − y``. If accuracy does not drop, the model ignores the shade. Then no
embedding distance can tell the label-shaded set from the uniform-green targets, whatever ε.
Prints both accuracies for each palette and seed.

Run: python bench/emdcfl_backdoor_diagnostic.py --data-dir "$FEDCLUST_DATA_DIR" [--seeds 0 1 2]
     [--epochs 6] [--conv 64 128] [--palettes authors]
"""

from __future__ import annotations

import argparse


def main() -> None:
    from fedclust.emdcfl import data as D
    from fedclust.emdcfl import model as M
    from fedclust.emdcfl.keys import model_spec
    from server_app.emdcfl_experiments import CPU_BACKDOOR

    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--test", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=0, help="round-0 epochs (0: the preset's)")
    p.add_argument("--conv", type=int, nargs=2, default=None, metavar=("CONV1", "CONV2"),
                   help="conv channels (default: the preset's 8 16; the paper's 64 128)")
    p.add_argument("--palettes", nargs="+", default=["authors", "wide"])
    args = p.parse_args()
    cfg = {**CPU_BACKDOOR, "dataset": "backdoor-mnist"}
    if args.epochs:
        cfg["emdcfl.local-epochs"] = args.epochs
    if args.conv:
        cfg["emdcfl.conv1"], cfg["emdcfl.conv2"] = args.conv
    spec = model_spec(cfg)
    print(f"round 0: {cfg['emdcfl.local-epochs']} epochs, conv {cfg['emdcfl.conv1']}/"
          f"{cfg['emdcfl.conv2']} channels", flush=True)
    for palette in args.palettes:
        for seed in args.seeds:
            # client 1 is in set 1 (client % 3): the label-shaded set
            d = D.client_split("backdoor-mnist", "max", 1, 30, cfg["emdcfl.samples"], args.test,
                               cfg["emdcfl.val-fraction"], seed, args.data_dir, palette)
            w, _ = M.train_local(spec, M.init_weights(spec, seed), d.x_train, d.y_train,
                                 cfg["emdcfl.local-epochs"], cfg["emdcfl.lr"],
                                 cfg["emdcfl.batch-size"], seed)
            grey = D._base("mnist", args.data_dir, "test")[0]       # noqa: SLF001
            tidx = D._slice(len(grey), 1, 0, args.test, seed, 1)    # noqa: SLF001
            own = M.evaluate(spec, w, d.x_test, d.y_test)[1]
            other = D.colourise(grey[tidx], D.backdoor_colours(1, 9 - d.y_test, palette))
            swapped = M.evaluate(spec, w, other, d.y_test)[1]
            print(f"palette {palette:7s} seed {seed}: test acc own shade {100 * own:.2f} %, "
                  f"re-shaded as 9-y {100 * swapped:.2f} % (drop {100 * (own - swapped):.2f} "
                  f"points)", flush=True)


if __name__ == "__main__":
    main()
