"""Exact FCM's sums phase answered for a round's simulated nodes at once
(:func:`client_apps.fcm_handlers.fcm_sums_batch`, :func:`fedclust.fcm.local_sums_many`): the
same sums as each node's own :func:`fedclust.fcm.local_sums` up to rounding, the same run."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import fcm


@pytest.mark.parametrize("m", [2.0, 1.6, 3.0])
def test_sums_of_stacked_clients_are_each_clients_own(m):
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(int(n), 3)) + rng.normal(size=3) for n in rng.integers(1, 90, 40)]
    centers = rng.normal(size=(5, 3))
    u, ws = fcm.local_sums_many(fcm.Pooled.of(xs), centers, m)
    assert u.shape == (40, 5) and ws.shape == (40, 5, 3)
    for k, x in enumerate(xs):
        u_k, ws_k = fcm.local_sums(x, centers, m)
        # the same terms added in another order: equal up to rounding
        np.testing.assert_allclose(u[k], u_k, rtol=1e-12)
        np.testing.assert_allclose(ws[k], ws_k, rtol=1e-11, atol=1e-13)


def test_stacking_refuses_no_clients_and_empty_clients():
    with pytest.raises(ValueError, match="rows in every client"):
        fcm.Pooled.of([np.ones((3, 2)), np.ones((0, 2))])
    with pytest.raises(ValueError, match="rows in every client"):
        fcm.Pooled.of([])


def test_a_nan_in_the_rows_is_refused():
    x = np.ones((4, 2))
    x[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fcm.local_sums_many(fcm.Pooled.of([np.zeros((3, 2)), x]), np.eye(2), 2.0)


def test_in_process_engine_answers_the_sums_phase_at_once(tmp_path, monkeypatch):
    """Every round's sums come from the batched handler, and the run is the run of one
    message at a time: the same rounds and labels, centers and objective equal up to
    rounding."""
    import client_apps.app  # noqa: F401
    from client_apps import base
    from server_app.inprocess import run_server

    calls: list[int] = []
    real = base.BATCHED["query.fcm_sums"]
    monkeypatch.setitem(base.BATCHED, "query.fcm_sums",
                        lambda items: calls.append(len(items)) or real(items))
    cfg = {"method": "exact-fcm", "dataset": "blobs", "num-clients": 6, "fcm.n-clusters": 3,
           "fcm.max-rounds": 6, "fcm.epsilon": 0.0, "plots": False, "seed": 4}
    one, _ = run_server({**cfg, "output-dir": str(tmp_path / "one")}, batch=False)
    assert calls == []
    together, _ = run_server({**cfg, "output-dir": str(tmp_path / "together")})
    assert calls == [6] * 6
    a, b = one["metrics"], together["metrics"]
    assert a["rounds"] == b["rounds"] == 6
    assert b["objective"] == pytest.approx(a["objective"], rel=1e-12)
    np.testing.assert_allclose(np.load(tmp_path / "together" / "centers.npy"),
                               np.load(tmp_path / "one" / "centers.npy"), rtol=1e-10)
    for i in range(6):
        la = np.loadtxt(tmp_path / "one" / "clients" / str(i) / "assignments.csv",
                        delimiter=",", skiprows=1)[:, 1]
        lb = np.loadtxt(tmp_path / "together" / "clients" / str(i) / "assignments.csv",
                        delimiter=",", skiprows=1)[:, 1]
        np.testing.assert_array_equal(la, lb)


def test_memberships_of_stacked_clients_are_each_clients_own():
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=(int(n), 3)) for n in rng.integers(1, 60, 25)]
    centers = rng.normal(size=(4, 3))
    u, j = fcm.memberships_many(fcm.Pooled.of(xs), centers, 1.7)
    assert u.shape == (sum(len(x) for x in xs), 4) and j.shape == (25,)
    start = 0
    for k, x in enumerate(xs):
        np.testing.assert_allclose(u[start:start + len(x)], fcm.memberships(x, centers, 1.7),
                                   rtol=1e-12, atol=1e-15)
        assert j[k] == pytest.approx(fcm.objective(x, centers, 1.7), rel=1e-10)
        start += len(x)


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_in_process_engine_answers_the_final_phase_at_once(tmp_path, monkeypatch, method):
    """The final phase comes from the batched handler: each node keeps the owner results of
    one message at a time (the same files, the same labels), the objective is the same up to
    rounding, and the files alike on every node are one file linked into each folder."""
    import json
    import os

    import client_apps.app  # noqa: F401
    from client_apps import base
    from server_app.inprocess import run_server

    calls: list[int] = []
    real = base.BATCHED["query.fcm_final"]
    monkeypatch.setitem(base.BATCHED, "query.fcm_final",
                        lambda items: calls.append(len(items)) or real(items))
    cfg = {"method": method, "dataset": "blobs", "num-clients": 5, "plots": False, "seed": 4,
           **({"fcm.n-clusters": 3, "fcm.max-rounds": 4, "fcm.epsilon": 0.0}
              if method == "exact-fcm" else
              {"fedfcm.k-min": 2, "fedfcm.k-max": 3, "fedfcm.max-rounds": 2})}
    one, _ = run_server({**cfg, "output-dir": str(tmp_path / "one")}, batch=False)
    assert calls == []
    together, _ = run_server({**cfg, "output-dir": str(tmp_path / "together")})
    assert calls == [5]
    key = "objective" if method == "exact-fcm" else "objective_best_k"
    assert together["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-9)
    inodes = {}
    for i in range(5):
        a, b = tmp_path / "one" / "clients" / str(i), tmp_path / "together" / "clients" / str(i)
        assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
        la = np.loadtxt(a / "assignments.csv", delimiter=",", skiprows=1)
        lb = np.loadtxt(b / "assignments.csv", delimiter=",", skiprows=1)
        np.testing.assert_array_equal(la[:, :2], lb[:, :2])
        np.testing.assert_allclose(la[:, 2:], lb[:, 2:], rtol=1e-10, atol=1e-14)
        # the centers of the two runs differ by rounding (the sums phase is batched too)
        for name in ("centers.npy", "scaling_shift.npy", "scaling_scale.npy"):
            np.testing.assert_allclose(np.load(a / name), np.load(b / name), rtol=1e-10)
        np.testing.assert_allclose(np.loadtxt(a / "centers.csv", delimiter=",", skiprows=1),
                                   np.loadtxt(b / "centers.csv", delimiter=",", skiprows=1),
                                   rtol=1e-10)
        for name in ("predict.json", "result.json"):
            assert json.loads((a / name).read_text()) == json.loads((b / name).read_text())
        assert os.stat(a / "centers.npy").st_nlink == 1        # a node's own file
        inodes.setdefault("centers.npy", set()).add(os.stat(b / "centers.npy").st_ino)
        inodes.setdefault("result.json", set()).add(os.stat(b / "result.json").st_ino)
    assert len(inodes["centers.npy"]) == 1 and len(inodes["result.json"]) == 5
