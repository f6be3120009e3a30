"""Benchmark: FedCRef's stacked autoencoders vs one-model-at-a-time PyTorch (same run).

Measures, for one client with K local clusters of S samples (784-100-64-32, mirrored):
  * training K autoencoders for E epochs: stacked (``fedclust.fedcref.autoencoder.train``) vs a
    loop over K ``nn.Sequential`` models with ``torch.optim.Adam`` (the reference approach);
  * cross-evaluation of M received models on the client's samples: batched
    (``autoencoder.errors``, first layer as one GEMM) vs a loop of per-model forward passes.
Prints absolute times and the ratios (noisy shared machine: compare ratios, not seconds).

    python bench/bench_fedcref_ae.py [--k 4] [--s 500] [--epochs 5] [--batch 64] [--m 40]
"""

from __future__ import annotations

import time

import numpy as np
import torch
from _common import parser

from fedclust.fedcref import autoencoder as ae


def _net(d: int) -> torch.nn.Sequential:
    sizes = ae.layer_sizes(d, [100, 64, 32])
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [torch.nn.Linear(a, b), torch.nn.Sigmoid() if i == len(sizes) - 2
                   else torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def main() -> None:
    ap = parser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--s", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--m", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    d = 784
    data = [rng.random((a.s, d)).astype(np.float32) for _ in range(a.k)]

    t0 = time.perf_counter()
    for x in data:
        net = _net(d)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        xt = torch.as_tensor(x)
        for _ in range(a.epochs):
            perm = torch.randperm(len(xt))
            for s in range(0, len(xt), a.batch):
                xb = xt[perm[s:s + a.batch]]
                loss = ((net(xb) - xb) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    loop_train = time.perf_counter() - t0

    t0 = time.perf_counter()
    ae.train(ae.TrainCall(ae.init_params(a.k, ae.layer_sizes(d, [100, 64, 32]), 0), data,
                          a.epochs, a.batch))
    stacked_train = time.perf_counter() - t0

    models = ae.init_params(a.m, ae.layer_sizes(d, [100, 64, 32]), 1)
    x = np.concatenate(data)
    t0 = time.perf_counter()
    with torch.no_grad():
        xt = torch.as_tensor(x)
        for i in range(a.m):
            one = ae.select(models, [i])
            rec = ae.forward(one, xt[None])
            ((rec[0] - xt) ** 2).mean(1)
    loop_eval = time.perf_counter() - t0
    t0 = time.perf_counter()
    ae.errors(models, x)
    batched_eval = time.perf_counter() - t0

    print(f"train {a.k} AEs x {a.s} samples x {a.epochs} epochs (batch {a.batch}): "
          f"loop {loop_train:.2f}s, stacked {stacked_train:.2f}s, "
          f"speed-up {loop_train / stacked_train:.2f}x")
    print(f"cross-evaluate {a.m} models on {len(x)} samples: loop {loop_eval:.2f}s, "
          f"batched {batched_eval:.2f}s, speed-up {loop_eval / batched_eval:.2f}x")


if __name__ == "__main__":
    main()
