"""EMD-CFL client-side costs: the optimised paths against the previous ones, as ratios
measured in the same run (machine noise cancels).

- embedding step of one client (``query.emdcfl_embed``): own train set under its own model,
  own validation set under all ``--clients`` models. Old: per peer, build a ``CNN`` module,
  load the state dict, convert the images again, NCHW ``ReLU → MaxPool``. New:
  :func:`fedclust.emdcfl.model.embed_many` (images converted once, functional forward,
  channels-last conv, strided-view pooling, pool before ReLU);
- one local epoch (``train_local``): old NCHW module with ``ReLU → MaxPool`` vs channels-last
  with ``MaxPool → ReLU``;
- test evaluation: module path vs functional path.

Run (pin to one core): taskset -c 0 python bench/bench_emdcfl_pipeline.py [--clients 40]
    [--train 4878] [--val 542] [--conv1 8 --conv2 16]
"""

from __future__ import annotations

import numpy as np
import torch
from _common import parser as bench_parser
from _common import seconds as timed
from torch import nn


def old_train(spec, weights, x, y, epochs, lr, batch_size, seed):
    """The previous ``train_local`` (NCHW module, ReLU → MaxPool), kept for the ratio."""
    from fedclust.emdcfl.model import CNN, get_weights, to_tensor

    model = CNN(spec)
    f = model.features                      # previous layer order: conv, relu, conv, relu, pool
    model.features = nn.Sequential(f[0], f[1], f[2], f[4], f[3], f[5], f[6], f[7])
    keys = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights)})
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-6)
    xt, yt = to_tensor(x), torch.from_numpy(np.asarray(y, dtype=np.int64))
    gen = torch.Generator().manual_seed(int(seed))
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        stop = len(xt) - len(xt) % batch_size
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return get_weights(model)


def old_embed(spec, weights, x):
    from fedclust.emdcfl.model import CNN, to_tensor

    model = CNN(spec)
    f = model.features
    model.features = nn.Sequential(f[0], f[1], f[2], f[4], f[3], f[5], f[6], f[7])
    keys = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights)})
    model.eval()
    with torch.no_grad():
        xt = to_tensor(x)
        return torch.cat([model.embed(xt[s:s + 1024]) for s in range(0, len(xt), 1024)]).numpy()


def main() -> None:
    from fedclust.emdcfl.model import (
        ModelSpec,
        embed,
        embed_many,
        evaluate,
        init_weights,
        train_local,
    )
    from fedclust.emdcfl.model import weights_from_record as read_model
    from strategies.wire.emdcfl import model_record

    parser = bench_parser(clients=40)
    parser.add_argument("--train", type=int, default=4878)
    parser.add_argument("--val", type=int, default=542)
    parser.add_argument("--conv1", type=int, default=8)
    parser.add_argument("--conv2", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = ModelSpec(1, 28, args.conv1, args.conv2, 128, 10)
    rng = np.random.default_rng(0)
    x_tr = rng.integers(0, 256, (args.train, 28, 28), dtype=np.uint8)
    y_tr = rng.integers(0, 10, args.train)
    x_val = rng.integers(0, 256, (args.val, 28, 28), dtype=np.uint8)
    # trained-ish distinct models: init + one short epoch each would cost too long; seeds differ
    records = [model_record(init_weights(spec, s)) for s in range(args.clients)]

    def old_step():
        own = read_model(records[0])
        e = [old_embed(spec, own, x_tr)]
        e += [old_embed(spec, read_model(r), x_val) for r in records]
        return e

    def new_step():
        own = read_model(records[0])
        e = [embed(spec, own, x_tr)]
        e += embed_many(spec, (read_model(r) for r in records), x_val)
        return e

    new_step()                                   # warm-up
    t_old, e_old = timed(old_step)
    t_new, e_new = timed(new_step)
    err = max(float(np.abs(a - b).max()) for a, b in zip(e_old, e_new))
    print(f"embedding step of one client ({args.clients} models x {args.val} val + own "
          f"{args.train} train, conv {args.conv1}/{args.conv2}): old {t_old:.2f} s, "
          f"new {t_new:.2f} s -> {t_old / t_new:.2f}x faster (max |diff| {err:.1e}); "
          f"{args.clients} clients: old {args.clients * t_old:.0f} s, "
          f"new {args.clients * t_new:.0f} s")

    w0 = init_weights(spec, 0)
    t_old, w_old = timed(lambda: old_train(spec, w0, x_tr, y_tr, 1, 0.05, 32, 1))
    t_new, w_new = timed(lambda: train_local(spec, w0, x_tr, y_tr, 1, 0.05, 32, 1)[0])
    err = max(float(np.abs(a - b).max()) for a, b in zip(w_old, w_new))
    print(f"one local epoch on {args.train} images (batch 32): old {t_old:.2f} s, "
          f"new {t_new:.2f} s -> {t_old / t_new:.2f}x faster (max |weight diff| {err:.1e})")

    x_te = rng.integers(0, 256, (2000, 28, 28), dtype=np.uint8)
    y_te = rng.integers(0, 10, 2000)
    from fedclust.emdcfl.model import build, to_tensor

    def old_eval():
        model = build(spec, w_new).eval()
        with torch.no_grad():
            out = model(to_tensor(x_te))
        return float((out.argmax(1).numpy() == y_te).mean())

    t_old, a_old = timed(old_eval)
    t_new, (_, a_new) = timed(lambda: evaluate(spec, w_new, x_te, y_te))
    print(f"evaluation of 2000 test images: old {1e3 * t_old:.0f} ms, new {1e3 * t_new:.0f} ms "
          f"-> {t_old / t_new:.2f}x (accuracy {a_old:.4f} vs {a_new:.4f})")


if __name__ == "__main__":
    main()
