"""Batched simulation: every client of a phase as one computation (fedclust/emdcfl/batched.py,
fedclust/fedcref/batched.py, the in-process engine's batched handlers) against the per-client
path, on the CPU.

- The stacked layout (the default on CUDA) gives each client's own training: its weights
  equal the per-client training's to float rounding, for clients with different sizes and
  with fewer images than a batch.
- A whole run with the stacked layout gives the per-client run's clusters, and accuracies
  within the stated tolerance (``ACC_TOL``); the CPU default (per-client kernels inside the
  batched clients) gives the per-client run's numbers exactly.
- The in-process engine answers a phase with the batched handlers, and its runs equal the
  one-message-at-a-time engine's.
- The plain-Python X25519/HKDF (no ``cryptography``) and the EMD ground costs without POT give
  the same bytes and numbers.

Float rounding differs between the layouts, and plain SGD amplifies it (at lr 0.05 on the
``cpu`` preset's Rotated MNIST, two layouts' weights after one round differ by up to 36 % on
a client whose training is unstable); the systems here are chosen with their decisions far from
the thresholds (the smallest ``|excess − ε|`` is 0.047, the EMDs agree to 1e-5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import ConfigError, validate
from fedclust.emdcfl import batched, inmemory, loop
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.emdcfl.model import ModelSpec, init_weights, train_local
from fedclust.fedcref import algorithm
from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.batched import BatchedClients as FedCRefBatched
from fedclust.results import MemoryRecord

ROOT = Path(__file__).resolve().parents[2]
#: |mean test accuracy, stacked − per client| allowed on the systems below
ACC_TOL = 0.02
EMDCFL = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 8, "emdcfl.rounds": 2,
          "emdcfl.local-epochs": 3, "emdcfl.lr": 0.02, "emdcfl.conv1": 8, "emdcfl.conv2": 16,
          "emdcfl.embed-dim": 32, "emdcfl.samples": 400, "emdcfl.val-fraction": 0.2,
          "emdcfl.test-samples": 60, "emdcfl.batch-size": 16, "emdcfl.max-samples": 64,
          "emdcfl.workers": 1, "evaluate": True, "plots": False, "seed": 1}
SAME = ("num_clusters", "clusters", "eval_acc_mean", "eval_acc_worst", "eval_ari",
        "eval_acc_per_client")


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the clients of a simulation use (tiny steps on a busy 2-core
    machine crawl with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(clients, s: EMDCFLSettings) -> tuple[dict, MemoryRecord]:
    record = MemoryRecord()
    metrics = loop.run(clients, s, record)
    return json.loads(json.dumps(metrics, default=str)), record


# ------------------------------------------------------------------------------ EMD-CFL

@pytest.mark.parametrize("conv", ["grouped", "unfold", "loop"])
def test_stacked_training_is_each_clients_own_training(conv):
    spec = ModelSpec(1, 8, 4, 8, 16, 10)
    rng = np.random.default_rng(0)
    sizes = [100, 37, 10, 0]                 # full batches, a short tail, < one batch, none
    xs = [rng.integers(0, 256, (m, 8, 8), dtype=np.uint8) for m in sizes]
    ys = [rng.integers(0, 10, m) for m in sizes]
    starts = [init_weights(spec, i) for i in range(len(sizes))]
    seeds = [100 + i for i in range(len(sizes))]
    got, losses = batched.train_stacked(spec, starts, xs, ys, 2, 0.05, 16, seeds, conv=conv)
    for i in range(len(sizes)):
        want, loss = train_local(spec, starts[i], xs[i], ys[i], 2, 0.05, 16, seeds[i])
        for a, b in zip(got[i], want, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        assert losses[i] == pytest.approx(loss, rel=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(got[3], starts[3], strict=True))


def test_bf16_and_fp32_stacked_training_run_and_stay_close():
    spec = ModelSpec(1, 8, 4, 8, 16, 10)
    rng = np.random.default_rng(1)
    xs = [rng.integers(0, 256, (64, 8, 8), dtype=np.uint8) for _ in range(3)]
    ys = [rng.integers(0, 10, 64) for _ in range(3)]
    starts = [init_weights(spec, 0)] * 3
    fp32, l32 = batched.train_stacked(spec, starts, xs, ys, 1, 0.05, 16, [1, 2, 3],
                                      precision="fp32")
    bf16, l16 = batched.train_stacked(spec, starts, xs, ys, 1, 0.05, 16, [1, 2, 3],
                                      precision="bf16")
    assert np.allclose(l32, l16, atol=0.02)
    assert all(np.abs(a - b).max() < 0.02 for w, v in zip(fp32, bf16, strict=True)
               for a, b in zip(w, v, strict=True))


def test_layout_tuning_times_every_layout_and_picks_one():
    spec = ModelSpec(1, 8, 4, 8, 16, 10)
    for conv in batched.FORWARD:
        assert batched.time_step(spec, 3, 8, "cpu", conv, steps=1, warmup=1) > 0
    calls: list[str] = []
    best, times = batched.tune("cpu", lambda f: calls.append(f.__name__), steps=1)
    assert best in batched.FORWARD and set(times) == set(batched.FORWARD)
    assert len(calls) == 3 * len(batched.FORWARD)
    with pytest.raises(ValueError, match="conv"):
        batched.Batching(conv="winograd")


def test_batched_emdcfl_clients_agree_with_the_per_client_path():
    s = EMDCFLSettings.from_config(validate(EMDCFL))
    ref, ref_rec = _run(inmemory.InMemoryClients.simulated(s, 8), s)
    cpu, cpu_rec = _run(batched.BatchedClients.simulated(s, 8), s)
    assert {k: cpu[k] for k in SAME} == {k: ref[k] for k in SAME}      # the same kernels
    np.testing.assert_array_equal(cpu_rec.arrays["emd_matrix"], ref_rec.arrays["emd_matrix"])
    stacked, st_rec = _run(batched.BatchedClients.simulated(
        s, 8, batched.Batching(stack=True)), s)
    assert stacked["clusters"] == ref["clusters"]
    assert stacked["eval_ari"] == ref["eval_ari"]
    assert abs(stacked["eval_acc_mean"] - ref["eval_acc_mean"]) <= ACC_TOL
    a, b = st_rec.arrays["emd_matrix"], ref_rec.arrays["emd_matrix"]
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], atol=1e-4)


def test_batched_ifca_clients_agree_with_the_per_client_path():
    cfg = {**EMDCFL, "emdcfl.algorithm": "ifca"}
    s = EMDCFLSettings.from_config(validate(cfg))
    ref, _ = _run(inmemory.InMemoryClients.simulated(s, 8), s)
    stacked, _ = _run(batched.BatchedClients.simulated(
        s, 8, batched.Batching(stack=True)), s)
    assert stacked["clusters"] == ref["clusters"]
    assert abs(stacked["eval_acc_mean"] - ref["eval_acc_mean"]) <= ACC_TOL


def _spy(monkeypatch) -> dict[str, int]:
    import client_apps.app  # noqa: F401  (registers the handlers)
    from client_apps import base

    calls: dict[str, int] = {}
    for kind, fn in list(base.BATCHED.items()):
        def spy(items, fn=fn, kind=kind):
            calls[kind] = calls.get(kind, 0) + len(items)
            return fn(items)
        monkeypatch.setitem(base.BATCHED, kind, spy)
    return calls


@pytest.mark.parametrize("extra", [{}, {"emdcfl.algorithm": "ifca"}])
def test_in_process_engine_answers_a_phase_at_once(tmp_path, monkeypatch, extra):
    from server_app.inprocess import run_server

    calls = _spy(monkeypatch)
    cfg = {**EMDCFL, "num-clients": 4, "emdcfl.samples": 200, **extra}
    one, _ = run_server({**cfg, "output-dir": str(tmp_path / "one")}, batch=False)
    assert calls == {}
    together, _ = run_server({**cfg, "output-dir": str(tmp_path / "together")})
    kinds = ({"train.emdcfl_ifca"} if extra else {"train.emdcfl_local", "query.emdcfl_embed"})
    assert kinds | {"evaluate.emdcfl_eval"} == set(calls)
    keep = [k for k in SAME if k in one["metrics"]]
    assert {k: together["metrics"][k] for k in keep} == {k: one["metrics"][k] for k in keep}
    assert together["metrics"]["dropped_nodes"] == []
    # the stacked layout through the engine: the same clusters
    monkeypatch.setattr(batched, "DEFAULT", batched.Batching(stack=True))
    stacked, _ = run_server({**cfg, "output-dir": str(tmp_path / "stacked")})
    assert stacked["metrics"]["clusters"] == one["metrics"]["clusters"]


def test_a_failing_batched_handler_falls_back_to_one_message_at_a_time(tmp_path,
                                                                        monkeypatch):
    import client_apps.app  # noqa: F401
    from client_apps import base
    from server_app.inprocess import run_server

    def broken(items):
        raise RuntimeError("batched handler broken")

    monkeypatch.setitem(base.BATCHED, "train.emdcfl_local", broken)
    cfg = {**EMDCFL, "num-clients": 4, "emdcfl.samples": 200, "emdcfl.rounds": 1}
    summary, _ = run_server({**cfg, "output-dir": str(tmp_path / "run")})
    assert summary["metrics"]["dropped_nodes"] == []
    assert len(summary["metrics"]["clusters"]) == 4


# ------------------------------------------------------------------------------ FedCRef

def test_merged_autoencoder_training_is_each_models_own_training():
    rng = np.random.default_rng(0)
    data = [rng.random((n, 20)).astype(np.float32) for n in (50, 33, 7, 0, 64)]
    p0 = ae.init_params(5, ae.layer_sizes(20, [8, 4]), 3)
    calls = [ae.TrainCall(ae.select(p0, [m]), [data[m]], 4 + m % 2, 16, 1e-3, 2, 10 + m)
             for m in range(5)]
    alone = ae.train_calls(calls, merge=False)
    together = ae.train_calls(calls, merge=True)
    for a, b in zip(alone, together, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    # one parameter buffer (the CUDA layout) and one tensor per layer: the same arithmetic
    per_layer, _ = ae.train(ae.TrainCall(p0, data, 5, 16, 1e-3, 2, 7), fused=False)
    fused, _ = ae.train(ae.TrainCall(p0, data, 5, 16, 1e-3, 2, 7), fused=True)
    for x, y in zip(per_layer, fused, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fedcref.test_fedcref_e2e import planted

    return planted(tmp_path_factory.mktemp("planted"))


FEDCREF = {"fedcref.ae-epochs": 12, "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 2,
           "fedcref.max-iterations": 2}


def test_batched_fedcref_clients_agree_with_the_per_client_path(planted_root):
    from tests.fedcref.test_fedcref_algorithm import _inmemory

    ref, cfg = _inmemory(planted_root, evaluate=True, **FEDCREF)
    runs = {"ref": algorithm.run(ref, algorithm.Settings.from_config(cfg))}
    xs = [ref.xs[ref.order.index(i)] for i in range(ref.n)]
    ys = [ref.ys[ref.order.index(i)] for i in range(ref.n)]
    fresh, _ = _inmemory(planted_root, evaluate=True, **FEDCREF)
    starts = [fresh.states[fresh.order.index(i)].labels for i in range(ref.n)]
    clients = FedCRefBatched(xs, starts, cfg, ys=ys, stack=True)
    assert clients.stacked
    runs["merged"] = algorithm.run(clients, algorithm.Settings.from_config(cfg))
    keys = ("communities", "isolated", "edges", "clusters", "sizes", "active_after")
    history = {k: [{f: h[f] for f in keys} for h in r.history] for k, r in runs.items()}
    assert history["merged"] == history["ref"]
    assert history["ref"][0]["communities"] > 0          # community rounds were trained
    assert runs["merged"].summary["eval_acc_end"] == pytest.approx(
        runs["ref"].summary["eval_acc_end"], abs=ACC_TOL)


def test_in_process_engine_batches_fedcref_training(planted_root, tmp_path, monkeypatch):
    from fedclust.fedcref import batched as fb
    from server_app.inprocess import run_server
    from tests.fedcref.test_fedcref_algorithm import FIXED

    calls = _spy(monkeypatch)
    cfg = {**FIXED, **FEDCREF, "data-dir": str(planted_root), "evaluate": True}
    runs = {}
    for name, merge in (("one", None), ("merged", True)):
        monkeypatch.setattr(fb, "MERGE", merge)
        out = tmp_path / name
        run_server({**cfg, "output-dir": str(out)}, batch=name != "one")
        runs[name] = [{k: v for k, v in json.loads(line).items() if "seconds" not in k
                       and not k.endswith("_s") and "bytes" not in k}
                      for line in (out / "history.jsonl").read_text().splitlines()]
    assert {"train.fedcref_local", "train.fedcref_comm"} <= set(calls)
    assert runs["merged"] == runs["one"]


def test_fedcref_device_is_checked_on_the_node(monkeypatch):
    from fedclust.fedcref.keys import ClientSettings

    base = {"method": "fedcref", "dataset": "digits", "num-clients": 3}
    assert validate(base)["fedcref.device"] == "cpu"
    with pytest.raises(ConfigError, match="fedcref.device"):
        validate({**base, "fedcref.device": "tpu"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s = ClientSettings.from_config(validate({**base, "fedcref.device": "cuda"}))
    with pytest.raises(ConfigError, match=r"'fedcref.device' = 'cuda'.*Allowed.*Fix"):
        s.torch_device()
    auto = ClientSettings.from_config(validate({**base, "fedcref.device": "auto"}))
    assert auto.torch_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert auto.torch_device() == "cuda"


# ------------------------------------------------------------------------------ bare machines

def test_plain_python_x25519_and_hkdf_give_cryptographys_bytes(monkeypatch):
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )

    from fedclust.emdcfl import privacy, x25519

    # RFC 7748 §5.2, first vector
    k = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
    assert x25519.x25519(k, u).hex() == ("c3da55379de9c6908e94ea4df28d084f"
                                         "32eccf03491c71f754b4075577a28552")
    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = (rng.integers(0, 256, 32, dtype=np.uint8).tobytes() for _ in range(2))
        pub_b = X25519PrivateKey.from_private_bytes(b).public_key().public_bytes_raw()
        assert x25519.x25519(a, pub_b) == X25519PrivateKey.from_private_bytes(a).exchange(
            X25519PublicKey.from_public_bytes(pub_b))
        assert x25519.hkdf_sha256(a, 32, b"fedclust") == privacy._hkdf(a, b"fedclust")
    with_lib = [privacy.simulated_keypair(3, i) for i in range(3)]
    r_lib = privacy.PairContext(with_lib[0][0], 1, 2, with_lib[1][1], 16, 0.5).R
    monkeypatch.setattr(privacy, "HKDF", None)            # as if cryptography were missing
    assert [privacy.simulated_keypair(3, i) for i in range(3)] == with_lib
    np.testing.assert_array_equal(
        privacy.PairContext(with_lib[0][0], 1, 2, with_lib[1][1], 16, 0.5).R, r_lib)
    with pytest.raises(ImportError, match="cryptography"):
        privacy.generate_keypair()


def test_ground_costs_are_pots_without_pot():
    import warnings

    import ot

    from fedclust.emdcfl.distance import ground_cost

    rng = np.random.default_rng(0)
    p, q = rng.normal(size=(30, 6)), rng.normal(size=(20, 6))
    p[2] = 0.0                                           # an all-zero embedding
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for metric in ("cosine", "euclidean", "sqeuclidean"):
            np.testing.assert_array_equal(ground_cost(p, q, metric),
                                          ot.dist(p, q, metric=metric))
            np.testing.assert_array_equal(ground_cost(p, p, metric),
                                          ot.dist(p, p, metric=metric))


@pytest.mark.slow
def test_gpu_check_script_runs_every_part_on_the_cpu(tmp_path):
    """bench/gpu_check.py with tiny sizes on the CPU, without flwr, cryptography and POT (as
    on the GPU machine): every part runs and lands in the JSON."""
    from tests.fedcref.test_fedcref_e2e import planted

    data = planted(tmp_path / "data", n_classes=10, per_class=300)    # mnist-train.npz
    x = np.load(data / "mnist" / "mnist-train.npz")
    np.savez_compressed(data / "mnist" / "mnist-test.npz",
                        x=np.kron(x["x"], np.ones((4, 4), np.uint8))[:, :28, :28][:200],
                        y=x["y"][:200])
    np.savez_compressed(data / "mnist" / "mnist-train.npz",
                        x=np.kron(x["x"], np.ones((4, 4), np.uint8))[:, :28, :28], y=x["y"])
    out = tmp_path / "check.json"
    args = [str(ROOT / "bench" / "gpu_check.py"), "--data-dir", str(data), "--device", "cpu",
            "--tiny", "--out", str(out), "--workers", "1", "--cpu-threads", "1",
            "--bench-steps", "1", "--fedcref-iterations", "1",
            "--budget", "100000"]      # no part skipped for time: the timeout below bounds it
    # as on the GPU machine: no flwr, no cryptography, no POT (nor Hydra)
    bare = ("import importlib.abc, runpy, sys\n"
            "class Bare(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('flwr', 'cryptography', 'ot', 'hydra'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Bare())\n"
            f"sys.argv = {args!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    r = json.loads(out.read_text())
    assert not r["errors"]
    for part in ("env", "steps", "emdcfl", "fedcref_gpu", "fedcref_cpu", "emdcfl_fp32"):
        assert part in r["parts"], part
    assert r["parts"]["emdcfl"]["train_s"] > 0 and "ari" in r["parts"]["emdcfl"]
    assert r["parts"]["emdcfl"]["epsilon_rule"] is not None      # ε auto, as the preset
    assert r["fedcref_ratio"]["phases_compared"] >= 4
    assert "FedCRef CPU/GPU" in proc.stdout
    assert r["parts"]["env"]["cryptography"] is None and r["parts"]["env"]["ot"] is None
