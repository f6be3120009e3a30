"""FedCRef's model codecs: bytes and CPU per model, int8 against int8-delta, in one run.

Trains the first local phase of a simulated system (every client's fresh cluster
autoencoders, as the run's first iteration does) and one FedAvg round of community training
on each cluster's own samples, then encodes and decodes each model both ways:

- a fresh cluster model (what is uploaded and relayed for cross-evaluation): ``int8``
  against ``int8-delta`` with its seeded initialisation as base;
- a model one round on from the copy the receiver holds (community rounds): ``int8``
  against ``int8-delta`` with that copy as base.

Prints bytes per model and the median encode and decode time per model, each with its ratio
to ``int8``'s measured in the same run; checks that both decode to the same weights::

    python bench/bench_fedcref_wire.py --data-dir $FEDCLUST_DATA_DIR --clients 10 --seed 100
"""

from __future__ import annotations

import numpy as np
from _common import median_ms, parser, print_json


def main() -> None:
    import torch

    from fedclust.config import validate
    from fedclust.fedcref import autoencoder as ae
    from fedclust.fedcref import client as core
    from fedclust.fedcref import wire
    from fedclust.fedcref.initial import Dirty, initial_clustering
    from fedclust.fedcref.keys import ClientSettings

    ap = parser(__doc__, first_line=True, data_dir=True, dataset="mnist", clients=10,
                samples_per_cluster=150, seed=100, repeats=5, repeats_flag="--reps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = validate({"method": "fedcref", "dataset": args.dataset, "data-dir": args.data_dir,
                    "fedcref.split": "all", "num-clients": args.clients, "seed": args.seed,
                    "fedcref.samples-per-cluster": args.samples_per_cluster,
                    "output-dir": "unused"})
    s = ClientSettings.from_config(cfg)
    phase = core.derive_seed(args.seed, 1, 1)
    fresh, rounds = [], []
    for i in range(args.clients):
        x, y = core.client_data(cfg, i)
        key = core.client_key(x)
        st = core.ClientState(labels=initial_clustering(
            Dirty(s.dirtiness), x, int(np.unique(y).size), y_true=y,
            random_state=core.derive_seed(args.seed, key, 0)), k=int(np.unique(y).size))
        seed = core.derive_seed(phase, key)
        core.train_local(st, x, s, seed)
        models = ae.to_numpy(st.models)
        count = len(st.model_clusters)
        init = wire.resolve(np.array([[wire.INIT, seed, count, j] for j in range(count)]),
                            ae.layer_sizes(x.shape[1], s.hidden), s.ae_init)
        for j, q in enumerate(st.model_clusters):
            row = {k: v[j:j + 1] for k, v in models.items()}
            fresh.append((row, {k: v[j:j + 1] for k, v in init.items()},
                          np.array([[wire.INIT, seed, count, j]])))
            held = wire.roundtrip(row, "int8")
            call, _ = core.community_call(x, st.labels, ae.from_numpy(held),
                                          [np.array([q])], s, seed + j)
            trained = call.run()
            rounds.append((ae.to_numpy(trained), held, np.array([[wire.HELD, 0, 0, j]])))
    out = {}
    for name, cases in (("fresh cluster model vs its initialisation", fresh),
                        ("one FedAvg round vs the held copy", rounds)):
        n8 = nd = 0
        t = {"int8 encode": [], "int8 decode": [], "int8-delta encode": [],
             "int8-delta decode": []}
        for model, base, ids in cases:
            e8 = wire.encode(model, "int8")
            ed = wire.encode(model, wire.DELTA, base, ids)
            n8 += sum(v.nbytes for v in e8.values())
            nd += sum(v.nbytes for v in ed.values())
            got, want = wire.decode(ed, base), wire.decode(e8)
            assert all(np.array_equal(got[k], want[k]) for k in want)
            t["int8 encode"].append(median_ms(lambda m=model: wire.encode(m, "int8"),
                                              args.reps))
            t["int8 decode"].append(median_ms(lambda e=e8: wire.decode(e), args.reps))
            t["int8-delta encode"].append(median_ms(
                lambda m=model, b=base, i=ids: wire.encode(m, wire.DELTA, b, i), args.reps))

            def decode_fresh(e=ed, b=base) -> None:
                wire._DECODED.clear()         # time the decode, not the simulation's cache
                wire.decode(e, b)

            t["int8-delta decode"].append(median_ms(decode_fresh, args.reps))
        ms = {k: float(np.mean(v)) for k, v in t.items()}
        out[name] = {"models": len(cases), "int8 bytes": n8 // len(cases),
                     "int8-delta bytes": nd // len(cases), "bytes ratio": round(nd / n8, 3),
                     **{f"{k} ms": round(v, 2) for k, v in ms.items()},
                     "encode ratio": round(ms["int8-delta encode"] / ms["int8 encode"], 1),
                     "decode ratio": round(ms["int8-delta decode"] / ms["int8 decode"], 1)}
    print_json(out, indent=1)


if __name__ == "__main__":
    main()
