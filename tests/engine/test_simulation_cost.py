"""Simulation at the clients' cost: the run config reaches a node once per run, a node's data is
read once per process while its file is unchanged, arrays cross without numpy.save/load, and
moved results are recorded in one manifest update; none of it changes what a run computes."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Context, Message, RecordDict
from sklearn.datasets import make_blobs

import client_apps.base as base
import strategies.common as common
from client_apps.app import app as client_app
from client_apps.data import file_cached, load_client_data
from fedclust import fcm, npy, outputs
from fedclust.outputs import read_manifest
from strategies.methods import ExactFCM, FedFCM
from strategies.wire import replies
from tests.fake_grid import InProcessGrid, run_server

ROOT = Path(__file__).resolve().parents[2]


def node_files(tmp_path: Path, clients: int = 3, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    x, _ = make_blobs(120 * clients, centers=3, cluster_std=1.0, center_box=(-10, 10),
                      random_state=seed)
    nodes = []
    for i, part in enumerate(np.array_split(x, clients)):
        np.savez(tmp_path / f"c{i}.npz", x=part)
        nodes.append({"data-path": str(tmp_path / f"c{i}.npz")})
    return nodes, x


def carried(msg: Message) -> ConfigRecord | None:
    return msg.content.get(base.CONFIG_RECORD)


# ---------------------------------------------------------------------------- the run config

def test_both_ends_name_the_config_record_alike():
    assert (common.CONFIG_RECORD, common.CONFIG_JSON, common.CONFIG_DIGEST) == (
        base.CONFIG_RECORD, base.CONFIG_JSON, base.CONFIG_DIGEST)
    assert common.CONFIG_MISSING == base.RunConfigMissing.__name__
    assert base.RunConfigMissing.data_free


def test_the_whole_config_reaches_each_node_once_per_run(tmp_path):
    cfg = {"method": "exact-fcm", "num-clients": 3, "fcm.max-rounds": 4, "fcm.epsilon": 0.0,
           "plots": False, "output-dir": str(tmp_path / "run")}
    summary, grid = run_server(cfg, keep_sent=True)
    assert summary["metrics"]["rounds"] == 4
    by_node: dict[int, list[ConfigRecord]] = {}
    for msg in grid.sent:
        if msg.metadata.message_type == "query.fedclust_node":   # before the run: no config
            continue
        rec = carried(msg)
        assert rec is not None, msg.metadata.message_type    # every message names the config
        by_node.setdefault(msg.metadata.dst_node_id, []).append(rec)
    assert sorted(by_node) == sorted(grid.contexts)
    for records in by_node.values():
        whole = [r for r in records if base.CONFIG_JSON in r]
        assert len(records) >= 6 and len(whole) == 1 and records[0] is whole[0]
        assert {r[base.CONFIG_DIGEST] for r in records} == {whole[0][base.CONFIG_DIGEST]}


def test_a_strategy_object_runs_its_own_parameters_whatever_the_nodes_run_config(tmp_path):
    """The nodes' own run config says m = 1.5 and no scaling; ExactFCM(m=2.5) with minmax
    scaling must still give centralized FCM with m = 2.5 on the pooled, scaled rows."""
    nodes, x = node_files(tmp_path)
    grid = InProcessGrid(client_app, 3, {"method": "exact-fcm", "dataset": "local",
                                         "fcm.m": 1.5, "scaling": "none"}, node_configs=nodes)
    res = ExactFCM(n_clusters=3, m=2.5, epsilon=1e-9, max_rounds=300, scaling="minmax").start(
        grid=grid, dataset="local", output_dir=tmp_path / "run", run_config={"plots": False})
    shift, scale = res.arrays["scaling_shift"].numpy(), res.arrays["scaling_scale"].numpy()
    assert not np.allclose(scale, 1.0)
    central = fcm.fcm_from_centers((x - shift) / scale, res.arrays["initial_centers"].numpy(),
                                   2.5, 1e-9, 300)
    np.testing.assert_allclose(res.arrays["centers"].numpy(), central.centers, atol=1e-9)


def test_chained_methods_each_send_their_config_and_run_what_the_server_runs(tmp_path):
    """FedFCM then exact FCM on one grid: each run sends its whole config to every node once,
    and the second run equals exact FCM on a grid that never ran anything else."""
    nodes, _ = node_files(tmp_path, 4, seed=2)
    grid = InProcessGrid(client_app, 4, {"method": "fedfcm", "dataset": "local"},
                         node_configs=nodes, keep_sent=True)
    first = FedFCM(k_min=2, k_max=4).start(grid=grid, dataset="local",
                                           output_dir=tmp_path / "k", run_config={"plots": False})
    k = first.summary["metrics"]["best_k"]
    sent_first = len(grid.sent)
    second = ExactFCM(n_clusters=k, m=1.8).start(grid=grid, dataset="local",
                                                 output_dir=tmp_path / "c",
                                                 run_config={"plots": False})
    digests = [{carried(m)[base.CONFIG_DIGEST] for m in part}
               for part in (grid.sent[:sent_first], grid.sent[sent_first:])]
    assert all(len(d) == 1 for d in digests) and digests[0] != digests[1]
    whole = [m.metadata.dst_node_id for m in grid.sent[sent_first:]
             if base.CONFIG_JSON in carried(m)]
    assert sorted(whole) == sorted(grid.contexts)
    # a grid whose nodes' own run config is the one the strategy runs
    strategy = ExactFCM(n_clusters=k, m=1.8)
    args = {"dataset": "local", "output_dir": tmp_path / "ref", "run_config": {"plots": False}}
    fresh = InProcessGrid(client_app, 4, strategy.full_run_config(**args), node_configs=nodes)
    ref = strategy.start(grid=fresh, **args)
    np.testing.assert_array_equal(second.arrays["centers"].numpy(), ref.arrays["centers"].numpy())
    assert second.summary["metrics"]["objective"] == ref.summary["metrics"]["objective"]


def test_a_node_that_lost_the_config_is_sent_it_again_and_the_run_is_unchanged(tmp_path):
    cfg = {"method": "exact-fcm", "num-clients": 3, "fcm.max-rounds": 5, "fcm.epsilon": 0.0,
           "plots": False}
    ref, _ = run_server({**cfg, "output-dir": str(tmp_path / "ref")}, batch=False)
    missing = []

    def restart(nid: int, msg: Message) -> bool:
        """Just before node 1001's round-3 message, the node restarts: a new process, a new
        state (``drop`` is called before a node gets a message; it drops nothing here)."""
        if msg.metadata.group_id == "round-3" and nid == 1001 and not missing:
            base._CONFIGS.clear()
            grid.contexts[1001].state = RecordDict()
        return False

    def errors(msg: Message, rep: Message) -> None:
        if rep.has_error():
            missing.append(rep.error.reason)

    # one message at a time: the restart happens between node 1000's answer and node 1001's
    # (a batch would ask `drop` of every node first, and the other in-process nodes would
    # fill the process's config cache again before node 1001 is served)
    grid = InProcessGrid(client_app, 3, {**cfg, "output-dir": str(tmp_path / "run")},
                         drop=restart, inspect=errors, batch=False)
    from strategies.methods import from_run_config

    strategy, rest = from_run_config({**cfg, "output-dir": str(tmp_path / "run")})
    summary = strategy.start(grid, run_config=rest).summary
    assert len(missing) == 1 and missing[0].startswith("RunConfigMissing: ")
    assert "/" not in missing[0]          # data-free, path-free
    assert summary["metrics"]["dropped_nodes"] == [] and summary["metrics"]["rounds"] == 5
    np.testing.assert_array_equal(np.load(tmp_path / "run" / "centers.npy"),
                                  np.load(tmp_path / "ref" / "centers.npy"))
    assert summary["metrics"]["objective"] == ref["metrics"]["objective"]


def test_a_node_keeps_the_config_in_its_state_when_its_process_is_new(task_identity):
    """Deployment starts a ClientApp process per message: the config comes from the node's
    context.state, which outlives it; a message naming an unknown config is refused."""
    values = {"method": "exact-fcm", "fcm.m": 1.7}
    carried_cfg = common.CarriedConfig(values)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})

    def message(rec: ConfigRecord) -> Message:
        msg = Message(RecordDict({base.CONFIG_RECORD: rec}), dst_node_id=7,
                      message_type="query.x", group_id="g")
        return msg

    got = base.carried_config(message(carried_cfg.full), context)
    assert dict(got) == values and got.key == carried_cfg.digest
    base._CONFIGS.clear()                                   # a new process
    assert dict(base.carried_config(message(carried_cfg.ref), context)) == values
    base._CONFIGS.clear()
    with pytest.raises(base.RunConfigMissing):
        base.carried_config(message(carried_cfg.ref),
                            Context(run_id=1, node_id=8, node_config={}, state=RecordDict(),
                                    run_config={}))
    with pytest.raises(TypeError, match="read-only"):
        got["fcm.m"] = 3.0
    for twin in (copy.deepcopy(got), pickle.loads(pickle.dumps(got))):
        assert twin == got and twin.key == got.key and isinstance(twin, base.RunConfig)


# ------------------------------------------------------------------------------ node data

def test_a_file_is_read_once_while_unchanged_and_again_when_it_changes(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, x=np.arange(6.0).reshape(3, 2))
    reads = []

    def load():
        reads.append(1)
        with np.load(path) as z:
            return z["x"], None

    first = file_cached(str(path), load, "k")
    assert file_cached(str(path), load, "k") is first and len(reads) == 1
    assert file_cached(str(path), load, "other") is not first and len(reads) == 2
    assert not first[0].flags.writeable
    np.savez(path, x=np.ones((4, 2)))           # the owner replaces the data
    again = file_cached(str(path), load, "k")
    assert len(reads) == 3 and again[0].shape == (4, 2)
    folder = tmp_path / "images"
    folder.mkdir()
    file_cached(str(folder), load, "k")
    file_cached(str(folder), load, "k")        # a folder is read every time
    assert len(reads) == 5


def test_a_node_reads_its_data_file_once_per_process(tmp_path, monkeypatch):
    import client_apps.data as data

    path = tmp_path / "n.npz"
    np.savez(path, x=np.random.default_rng(0).normal(size=(50, 3)))
    calls = []
    real = data.load_local_table
    monkeypatch.setattr(data, "load_local_table",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    context = Context(run_id=1, node_id=1, node_config={"data-path": str(path)},
                      state=RecordDict(), run_config={})
    cfg = {"dataset": "local", "evaluate": False}
    a = load_client_data(context, cfg)
    b = load_client_data(context, cfg)
    assert len(calls) == 1 and b.x is a.x and not a.x.flags.writeable
    np.savez(path, x=np.zeros((5, 3)))
    assert load_client_data(context, cfg).x.shape == (5, 3) and len(calls) == 2


# ---------------------------------------------------------------------------- arrays

ARRAYS = [np.random.default_rng(0).normal(size=(4, 2)), np.arange(5, dtype=np.int64),
          np.ones((2, 3, 4), np.float32), np.array(2.5), np.zeros((0, 3)),
          np.asfortranarray(np.arange(12.0).reshape(3, 4)), np.array([1, 2], dtype=">i4"),
          np.array([True, False]), np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")])]


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_npy_bytes_are_numpys_and_read_back_as_numpy_does(a):
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(a), allow_pickle=False)
    for _ in range(2):                           # the second time from the kept header
        assert npy.dumps(a) == buffer.getvalue()
        fast = common.to_array(a)
        slow = Array(np.ascontiguousarray(a))
        assert (fast.dtype, fast.shape, fast.stype, fast.data) == (
            slow.dtype, slow.shape, slow.stype, slow.data)
    for data in (buffer.getvalue(), Array(a).data):
        got, ref = npy.loads(data), np.load(io.BytesIO(data), allow_pickle=False)
        assert got.dtype == ref.dtype and got.shape == ref.shape and np.array_equal(got, ref)
        assert got.flags.writeable and got.flags.f_contiguous == ref.flags.f_contiguous
    assert np.array_equal(common.to_numpy(Array(a)), a)


def test_records_built_without_flowers_checks_are_what_flowers_constructors_build():
    from flwr.app import ArrayRecord, MetricRecord
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from strategies.wire import records

    named = {"U": ARRAYS[0], "WS": ARRAYS[2], "n": ARRAYS[1]}
    fast = records.content({"sums": named}, {"withheld": 0, "rows": [1, 2]})
    slow = RecordDict({"sums": ArrayRecord({k: Array(np.ascontiguousarray(v))
                                            for k, v in named.items()}),
                       "metrics": MetricRecord({"withheld": 0, "rows": [1, 2]})})
    assert list(fast) == list(slow) and fast == slow
    for a, b in [(fast, slow), (fast["sums"], slow["sums"])] + [
            (fast["sums"][k], slow["sums"][k]) for k in named]:
        assert type(a) is type(b) and a.__dict__.keys() == b.__dict__.keys()
    assert fast["sums"]["U"].__dict__ == slow["sums"]["U"].__dict__
    assert fast.object_id == slow.object_id
    assert set(get_all_nested_objects(fast)) == set(get_all_nested_objects(slow))
    assert recorddict_from_proto(recorddict_to_proto(fast)) == slow
    plain = records.content(None, {"withheld": 0, "J": 1.5})
    assert plain == RecordDict({"metrics": MetricRecord({"withheld": 0, "J": 1.5})})
    assert plain["metrics"].__dict__.keys() == MetricRecord({"a": 1}).__dict__.keys()
    fast["sums"]["U"] = Array(np.zeros(2))      # still Flower's records: their checks apply
    with pytest.raises(TypeError):
        fast["sums"][3] = Array(np.zeros(2))
    with pytest.raises(TypeError):
        plain["metrics"]["flag"] = True
    with pytest.raises(TypeError):               # what Flower refuses is still refused
        records.content(None, {"flag": True})


def test_a_rounds_sums_are_read_in_one_pass_and_a_reply_of_another_layout_on_its_own():
    from strategies.wire import fcm as wire
    from strategies.wire.records import content

    box = wire.Box(np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    good = {n: content({"sums": {"U": np.full(2, 2.0), "WS": np.full((2, 2), 0.5)}},
                       {"withheld": 0}) for n in range(4)}
    rows = {n: 4 for n in range(5)}
    got = wire.sums_passing(good, 2, 2, box, rows, 2.0)
    assert sorted(got) == [0, 1, 2, 3] and all(np.array_equal(u, [2.0, 2.0]) for u, _ in
                                                 got.values())
    odd = dict(good)
    odd[4] = content({"sums": {"U": np.full(2, 2.0, np.float32), "WS": np.full((2, 2), 0.5)}},
                     {"withheld": 0})               # float32: not taken here
    odd[1] = content({"sums": {"U": np.full(2, np.nan), "WS": np.full((2, 2), 0.5)}},
                     {"withheld": 0})               # read, then refused by the values' test
    assert sorted(wire.sums_passing(odd, 2, 2, box, rows, 2.0)) == [0, 2, 3]


def test_npy_refuses_what_numpy_load_refuses():
    good = npy.dumps(np.arange(8.0))
    with pytest.raises(ValueError, match="fewer values"):
        npy.loads(good[:-3])
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickle"):
        npy.loads(obj.getvalue())
    for junk in (b"", b"not an array", b"PK\x03\x04" + b"\0" * 30):
        with pytest.raises(Exception):   # noqa: B017 - numpy's own errors, as numpy.load
            npy.loads(junk)
    # a reply whose bytes are no array is rejected by the check, not crashing the server
    bad = RecordDict({"sums": common.arrays(U=np.ones(2))})
    bad["sums"]["U"] = Array(dtype="float64", shape=(2,), stype=npy.STYPE, data=b"junk")
    arr, problem = replies.read_array(bad, "sums", "U")
    assert arr is None and "not a readable array" in problem


@pytest.mark.parametrize("values, rules, expected", [
    ([1.0, 2.0], {"low": 0.0, "high": 3.0}, None),
    ([1.0, -2.0], {"low": 0.0}, "has a value -2 below 0"),
    ([1.0, 5.0], {"high": 3.0}, "has a value 5 above 3"),
    ([1.0, np.nan], {}, "has NaN values"),
    ([1.0, np.inf], {}, "has infinite values"),
    ([1.0, np.nan], {"nan_ok": True, "low": 0.0}, None),
    ([1.0, np.nan, -1.0], {"nan_ok": True, "low": 0.0}, "below 0"),
    ([1.5, 2.0], {"integral": True}, "not whole numbers"),
    ([1, 2], {"integral": True, "high": 2}, None),
])
def test_value_checks_say_the_same_with_and_without_non_finite_values(values, rules, expected):
    problem = replies.values_problem("v", np.array(values), **rules)
    assert problem is None if expected is None else expected in problem


# ---------------------------------------------------------------------------- outputs

def test_moved_result_folders_are_recorded_in_one_manifest_update(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    outputs.write_manifest(run, {})
    moved = []
    for i in range(3):
        d = run / "clients" / str(i)
        (d / "sub").mkdir(parents=True)
        (d / "a.csv").write_text("x")
        (d / "sub" / "b.npy").write_text("y")
        moved.append(d)
    own = run / "clients" / "2" / "sub"          # a folder with a manifest of its own
    outputs.write_manifest(own, {})
    writes = []
    real = outputs.write_manifest
    monkeypatch.setattr(outputs, "write_manifest", lambda f, e: writes.append(f) or real(f, e))
    outputs.record_tree(*moved)
    assert sorted(map(str, writes)) == sorted([str(run), str(own)])
    entries = read_manifest(run)
    assert entries["clients"] == "dir" and entries["clients/0/sub/b.npy"] == "file"
    assert entries["clients/2/sub"] == "dir" and "clients/2/sub/b.npy" not in entries
    assert read_manifest(own)["b.npy"] == "file"


# ---------------------------------------------------------------------------- durability

def _count_flushes(monkeypatch) -> dict[str, int]:
    """Count ``os.fsync`` (still done) and ``os.sync`` (counted only) calls."""
    calls = {"fsync": 0, "sync": 0}
    real = os.fsync

    def fsync(fd):
        calls["fsync"] += 1
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "sync", lambda: calls.__setitem__("sync", calls["sync"] + 1))
    return calls


@pytest.mark.parametrize("clients", [4, 9])
def test_a_simulation_makes_every_file_durable_once_at_its_end(tmp_path, monkeypatch, clients):
    import fedclust

    calls = _count_flushes(monkeypatch)
    manifests = []
    real = outputs.write_manifest
    monkeypatch.setattr(outputs, "write_manifest",
                        lambda f, e: manifests.append(f) or real(f, e))
    nodes, x = node_files(tmp_path, clients=clients)
    parts = [np.load(n["data-path"])["x"] for n in nodes]
    res = fedclust.simulate("exact-fcm", parts, n_clusters=3, max_rounds=3, epsilon=0.0,
                            output_dir=tmp_path / "run", run_config={"plots": False})
    assert calls == {"fsync": 0, "sync": 1}          # not one flush per file
    # the manifest is written at the start and once at the end, whatever the clients' count
    assert len(manifests) == 2, manifests
    entries = read_manifest(res.run_dir)
    for i in range(clients):   # every client's results are still written, complete, recorded
        folder = res.run_dir / "clients" / str(i)
        assert (folder / "result.json").is_file() and (folder / "assignments.csv").is_file()
        assert not list(folder.glob(".*.part"))
        assert {entries[f"clients/{i}/{f.name}"] for f in folder.iterdir()} == {"file"}
    assert (res.run_dir / "summary.json").is_file()
    assert len(res.labels) == clients and sum(map(len, res.labels)) == len(x)


def test_a_simulation_reads_back_the_tables_it_wrote_as_parsing_them_gives(tmp_path,
                                                                             monkeypatch):
    import fedclust
    from fedclust import results as fresults
    from strategies.methods import _owner_results

    nodes, _ = node_files(tmp_path, clients=4)
    parts = [np.load(n["data-path"])["x"] for n in nodes]
    parsed = []
    real = np.loadtxt
    monkeypatch.setattr(np, "loadtxt", lambda *a, **k: parsed.append(1) or real(*a, **k))
    res = fedclust.simulate("exact-fcm", parts, n_clusters=3, max_rounds=3, epsilon=0.0,
                            output_dir=tmp_path / "run", run_config={"plots": False})
    assert parsed == []                     # every table this process wrote, taken as written
    labels, memberships = _owner_results(res.run_dir)     # given once: now parsed
    assert len(parsed) == 4
    for got, want in zip(labels + memberships, res.labels + res.memberships, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    # a table changed after it was written is parsed, not taken from memory
    table = res.run_dir / "clients" / "1" / "assignments.csv"
    with fresults.keeping_written():
        fresults.remember_written(table, res.labels[1], res.memberships[1])
        text = table.read_text().splitlines()
        first = text[1].split(",")
        text[1] = ",".join(["0", str((int(first[1]) + 1) % 3)] + first[2:])
        table.write_text("\n".join(text) + "\n")
        parsed.clear()
        labels, _ = _owner_results(res.run_dir)
        assert len(parsed) == 4 and labels[1][0] == (res.labels[1][0] + 1) % 3
        fresults.remember_written(table, labels[1], None)     # unchanged since: taken
        assert fresults.recall_written(table)[0] is not None
    fresults.remember_written(table, labels[1], None)         # nothing kept outside
    assert fresults.recall_written(table) is None


def test_a_table_is_written_as_numpy_savetxt_writes_it(tmp_path):
    from fedclust.results import write_table

    rng = np.random.default_rng(0)
    u = rng.random((9000, 3))          # more rows than one formatting block
    cases = [(u, "%.17g"), (np.column_stack([np.arange(9000), u.argmax(1), u]),
                            ["%d", "%d", "%.17g", "%.17g", "%.17g"]),
             (np.array([np.nan, np.inf, -0.0, 1e-300, 5e-324]), "%.17g"),
             (rng.integers(-5, 5, (4, 2)), "%d")]
    for table, fmt in cases:
        rows = np.asarray(table).reshape(len(table), -1)
        header = [f"c{i}" for i in range(rows.shape[1])]
        write_table(tmp_path / "t.csv", header, table, fmt)
        want = io.BytesIO()
        np.savetxt(want, rows, delimiter=",", header=",".join(header), comments="", fmt=fmt)
        assert (tmp_path / "t.csv").read_bytes() == want.getvalue()


def test_an_in_process_run_syncs_once_and_a_deployed_nodes_writes_stay_durable(
        tmp_path, monkeypatch):
    calls = _count_flushes(monkeypatch)
    cfg = {"method": "exact-fcm", "num-clients": 3, "fcm.max-rounds": 2, "fcm.epsilon": 0.0,
           "plots": False, "output-dir": str(tmp_path / "run")}
    run_server(cfg)             # simulated nodes (partition-id) write into the run folder
    assert calls == {"fsync": 0, "sync": 1}
    assert len(list((tmp_path / "run" / "clients").glob("*/result.json"))) == 3
    # outside a simulation (a deployed node, a server of another engine) every file is flushed
    from client_apps import results

    site = tmp_path / "site"
    site.mkdir()
    results.write_result(site, {"method": "exact-fcm"})
    results.save_array(site / "centers.npy", np.zeros(2))
    assert calls == {"fsync": 2, "sync": 1}


def test_writes_under_a_run_folder_flushed_by_its_run_skip_their_own_flush(
        tmp_path, monkeypatch):
    calls = _count_flushes(monkeypatch)
    run, other = tmp_path / "run", tmp_path / "run-other"     # a prefix, not a parent
    (run / "clients" / "0").mkdir(parents=True)
    other.mkdir()
    outputs.flushed_by_run(run)          # what a simulated node does for the server's folder
    outputs.write_json(run / "clients" / "0" / "result.json", {"a": 1})
    assert calls["fsync"] == 0
    outputs.write_json(other / "result.json", {"a": 1})
    assert calls["fsync"] == 1
    assert json.loads((run / "clients" / "0" / "result.json").read_text()) == {"a": 1}


# ---------------------------------------------------------------------------- benchmark

def test_the_simulation_benchmark_prints_its_ratio(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_simulation_1000.py"),
                          "--sizes", "12x40", "24x20", "--rounds", "3",
                          "--central-repeats", "3"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ratio round / iteration" in out.stdout and "load average" in out.stdout
    assert out.stdout.count("end to end: simulate") == 2
    assert "| 24 | 20 |" in out.stdout             # the table of cost against size
