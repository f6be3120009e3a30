"""An untrusted world at the node's door: what a node's data, its node config and the run
config can do wrong, and what reaches the server when they do.

- Every error reply of a node (FCM, FedCRef, EMD-CFL) that fails on its data carries no file
  content (a planted secret header, a system file's lines) and no path of the node, also in the
  server's ``history.jsonl`` and ``summary.json``; the node's own log keeps the path.
- Tables: duplicate header names are refused; ``;``, tab, space and decimal-comma files read
  as their comma twins; symbolic link loops are named as such.
- Degenerate or foreign settings are refused before any work: ``fedfcm.local-k-max=1``, a key
  of another method, more clusters than rows; ``dataset=local`` without a ``data-path`` says
  how to give one.
- The privacy guard's boundary ``N = C(F+1)/F`` (withheld) and ``N + 1`` (sent).
- FedCRef and EMD-CFL nodes read through the same door: NaN, oversized, out-of-range and
  wrong-shape data are refused with a data-free error.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from client_apps.app import error_mod
from fedclust.config import ConfigError, defaults, validate
from fedclust.data.local import LocalDataError, load_image_arrays, load_local_table
from tests.data.test_local_data_door import REFUSED
from tests.fake_grid import run_server

SECRET_HEADER = "Jane Doe 123-45-6789 HIV+"
SECRET_BITS = ("Jane", "123-45-6789", "HIV", "PATIENT_SMITH")
SYSTEM_FILE = Path("/etc/passwd")
# example paths the fixes show (placeholders, no node's path)
EXAMPLE_PATHS = {"/abs/file.csv", "/abs/client.npz", "/path/to/its/data.csv"}
ABSOLUTE = re.compile(r"(?:^|(?<=[\s'\"(=]))/[\w.+-]+(?:/[\w.+-]*)*")


def _system_lines() -> list[str]:
    """Pieces of the system file's content that must not leak: its first lines, whole and as
    the text before their first blank (how a header or a cell would be quoted)."""
    if not SYSTEM_FILE.is_file():
        return []
    first = [line for line in SYSTEM_FILE.read_text().splitlines()[:3] if len(line) > 8]
    return sorted({*first, *(line.split()[0] for line in first)})


def assert_public(text: str, *private: str) -> None:
    """``text`` quotes no planted secret, no system-file content, no ``private`` string and no
    absolute path other than the placeholders of a fix."""
    for bit in (*SECRET_BITS, *_system_lines(), *private):
        assert bit not in text, f"{bit!r} leaked into: {text}"
    paths = set(ABSOLUTE.findall(text)) - EXAMPLE_PATHS
    assert not paths, f"absolute path(s) {paths} in: {text}"


def _reply_reason(handler: Callable[[], object], message_type: str = "query.fcm_stats") -> str:
    """The error reply a node sends when ``handler`` fails (through the ClientApp's error mod)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict(), dst_node_id=5, message_type=message_type)
    msg.metadata.__dict__["_message_id"] = "m1"
    rep = error_mod(msg, ctx, lambda m, c: handler())
    assert rep.has_error()
    return rep.error.reason


def _ctx(node_config: dict, run_config: dict) -> Context:
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                   run_config=run_config)


# ------------------------------------------------------------------ bad node data

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _symlink(path: Path, target: Path | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    return path


IRIS_ROWS = "5.1,3.5,1.4,0.2,0\n4.9,3.0,1.4,0.2,0\n6.3,3.3,6.0,2.5,2\n"
# (id, builder(folder) -> data path, node config beyond data-path)
HOSTILE: list[tuple[str, Callable[[Path], Path], dict]] = [
    ("secret-header-label-column", lambda t: _write(t / "site.csv", f"{SECRET_HEADER}\n"
                                                    f"{IRIS_ROWS}"), {"label-column": "label"}),
    ("secret-header-cells", lambda t: _write(t / "site.csv", f"a,b\n1,{SECRET_HEADER}\n"), {}),
    ("secret-header-names-duplicated", lambda t: _write(
        t / "site.csv", "Jane,123-45-6789,Jane,HIV+\n1,2,3,4\n"), {"label-column": "label"}),
    ("secret-semicolon-header", lambda t: _write(t / "site.csv", f"{SECRET_HEADER};x\n1;2\n"),
     {"label-column": "label"}),
    ("system-file-link", lambda t: _symlink(t / "site.csv", SYSTEM_FILE), {}),
    ("system-file-link-label-column", lambda t: _symlink(t / "site.csv", SYSTEM_FILE),
     {"label-column": "label"}),
    ("system-file-link-no-suffix", lambda t: _symlink(t / "site", SYSTEM_FILE), {}),
    ("system-file-link-as-npz", lambda t: _symlink(t / "site.npz", SYSTEM_FILE), {}),
    ("link-loop", lambda t: _symlink(t / "site.csv", t / "site.csv"), {}),
    ("link-loop-two-hops", lambda t: (_symlink(t / "a.csv", t / "b.csv"),
                                      _symlink(t / "b.csv", t / "a.csv"))[0], {}),
    ("missing-file", lambda t: t / "Jane_Doe_HIV" / "site.csv", {}),
    ("folder-without-images", lambda t: _write(t / "imgs" / "Jane_Doe.txt", SECRET_HEADER).parent,
     {}),
    ("label-column-out-of-range", lambda t: _write(t / "site.csv", IRIS_ROWS),
     {"label-column": "9"}),
]
HOSTILE += [(f"door-{case[0]}", case[1], {"data-format": case[2].get("data_format", ""),
                                           "label-column": case[2].get("label_column", "")})
            for case in REFUSED if "max_bytes" not in case[2]]


def _nodes_that_read(path: Path, extra: dict) -> dict[str, Callable[[], object]]:
    """How each method's node reads ``path`` (its own loader, as in a deployment)."""
    from client_apps import emdcfl_handlers, fedcref_handlers
    from client_apps.data import load_client_data

    node = {"data-path": str(path), **{k: v for k, v in extra.items() if v}}
    fcm = validate({"method": "exact-fcm", "dataset": "local"})
    fedcref = validate({"method": "fedcref", "dataset": "local"})
    emdcfl = validate({"method": "emdcfl", "dataset": "local", "emdcfl.preflight": False})
    fedcref_handlers._deployment_data.cache_clear()
    emdcfl_handlers._from_file.cache_clear()
    readers = {"exact-fcm": lambda: load_client_data(_ctx(node, fcm), fcm),
               "fedcref": lambda: fedcref_handlers._data(_ctx(node, fedcref), fedcref),
               "emdcfl": lambda: emdcfl_handlers.client_data(_ctx(node, emdcfl), emdcfl)}
    if len(node) > 1:     # FedCRef nodes read no data-format or label-column
        del readers["fedcref"]
    return readers


@pytest.mark.parametrize("case, build, extra", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_every_error_reply_is_free_of_content_and_paths(tmp_path, case, build, extra,
                                                        fedclust_log):
    if "system-file" in case and not SYSTEM_FILE.is_file():
        pytest.skip("no system file to link to")
    folder = tmp_path / "Jane_Doe_HIV_clinic"
    folder.mkdir()
    path = build(folder)
    for method, read in _nodes_that_read(path, extra).items():
        fedclust_log.clear()
        reason = _reply_reason(read)
        assert reason.startswith("LocalDataError: "), (method, reason)
        assert_public(reason, str(tmp_path), "Jane_Doe")
        # the operator's own log has the place
        assert any(str(folder) in line or str(path) in line for line in fedclust_log), \
            (method, fedclust_log)


def test_the_scan_catches_a_leak():
    """The scan above fails on a header quoted back, and on a node's path."""
    with pytest.raises(AssertionError):
        assert_public(f"names no column: its header has ['{SECRET_HEADER}']")
    with pytest.raises(AssertionError):
        assert_public("LocalDataError: /data/site0.csv: line 3 is not a number")
    with pytest.raises(AssertionError):
        assert_public("data-path ('/srv/x.csv') is empty")
    assert_public("Fix: flower-supernode --node-config 'data-path=\"/abs/file.csv\"'")


def test_secret_header_and_system_file_stay_out_of_the_servers_records(tmp_path):
    """The probe's repro end to end: one node's data-path is a file whose first line is a
    secret, another's a link to a system file; the run goes on with the others, and nothing
    of either file nor any node path is in history.jsonl or summary.json."""
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    nodes_dir = tmp_path / "Jane_Doe_nodes"
    nodes_dir.mkdir()
    nodes = []
    for i in range(3):
        rows = "\n".join(",".join(map(str, r)) + f",{c}" for r, c in zip(x[i::3], y[i::3]))
        header = SECRET_HEADER if i == 0 else "sl,sw,pl,pw,label"
        path = _write(nodes_dir / f"site{i}.csv", f"{header}\n{rows}\n")
        nodes.append({"data-path": str(path), "label-column": "label",
                      "allow-evaluation": True})
    if SYSTEM_FILE.is_file():
        nodes.append({"data-path": str(_symlink(nodes_dir / "sys.csv", SYSTEM_FILE)),
                      "label-column": "label"})
    out = tmp_path / "out"
    texts = []
    try:
        summary, _ = run_server({"method": "exact-fcm", "dataset": "local", "fcm.n-clusters": 3,
                                 "num-clients": len(nodes), "output-dir": str(out),
                                 "plots": False}, node_configs=nodes)
        texts.append(json.dumps(summary))
    except RuntimeError as exc:       # a run that stops names the failing nodes too
        texts.append(str(exc))
    texts += [f.read_text() for f in (out / "history.jsonl", out / "summary.json")
              if f.exists()]
    # the failing nodes are named, with the kind of problem
    assert any("LocalDataError" in t and "none named 'label'" in t for t in texts), texts
    for text in texts:
        assert str(nodes_dir) not in text and "Jane_Doe" not in text
        for bit in (*SECRET_BITS, *_system_lines()):
            assert bit not in text, bit


# ------------------------------------------------------------------ tables

def test_duplicate_header_names_are_refused_naming_the_columns(tmp_path):
    path = _write(tmp_path / "iris.csv", "sl,sw,label,pw,label\n5.1,3.5,0,0.2,1\n")
    with pytest.raises(LocalDataError, match=r"duplicate header names: columns 3 and 5 share "
                                             r"the name 'label' \(node config 'label-column'\)"):
        load_local_table(str(path), label_column="label")
    with pytest.raises(LocalDataError, match="columns 3 and 5 share one name"):
        load_local_table(str(path))           # refused whatever the label column
    other = _write(tmp_path / "o.csv", "a,b,a,label\n1,2,3,0\n")
    with pytest.raises(LocalDataError, match="columns 1 and 3 share one name") as info:
        load_local_table(str(other), label_column="label")
    assert "'a'" not in str(info.value) and "'a' in columns [1, 3]" in info.value.detail


COMMA = "f1,f2,label\n1.5,2,cat\n-3.25,4e-3,dog\n"


@pytest.mark.parametrize("name, text", [
    ("semicolon.csv", "f1;f2;label\n1.5;2;cat\n-3.25;4e-3;dog\n"),
    ("tab.csv", "f1\tf2\tlabel\n1.5\t2\tcat\n-3.25\t4e-3\tdog\n"),
    ("spaces.txt", "f1 f2 label\n1.5   2 cat\n-3.25 4e-3 dog\n"),
    ("decimal-comma.csv", "f1;f2;label\n1,5;2;cat\n-3,25;4e-3;dog\n"),
    ("decimal-comma-tab.tsv", "f1\tf2\tlabel\n1,5\t2\tcat\n-3,25\t4e-3\tdog\n"),
    ("comma-in-a-tsv.tsv", COMMA),
    ("quoted.csv", '"f1","f2","label"\n"1.5","2","cat"\n"-3.25","4e-3","dog"\n'),
    ("quoted-no-header.csv", None),
])
def test_other_separators_and_decimal_commas_read_as_the_comma_file(tmp_path, name, text):
    if text is None:        # quoted numbers without a header are rows, not a header line
        x, _ = load_local_table(str(_write(tmp_path / name, '"1.5","2"\n"-3.25","4e-3"\n')))
        np.testing.assert_array_equal(x, [[1.5, 2.0], [-3.25, 4e-3]])
        return
    want_x, want_y = load_local_table(str(_write(tmp_path / "ref.csv", COMMA)),
                                      label_column="label", stable_labels=True)
    x, y = load_local_table(str(_write(tmp_path / name, text)), label_column="label",
                            stable_labels=True)
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)


def test_a_bad_cell_of_a_semicolon_file_is_located_with_its_separator(tmp_path):
    path = _write(tmp_path / "s.csv", "1;2\n3;4\n5;x\n")
    with pytest.raises(LocalDataError, match=r"line 3, column 2 is not a number \(read as "
                                             r"separated by semicolons\)"):
        load_local_table(str(path))


@pytest.mark.parametrize("name", ["loop.csv", "loop", "loop.npz"])
def test_symlink_loops_are_named_as_such(tmp_path, name):
    path = _symlink(tmp_path / name, tmp_path / name)
    with pytest.raises(LocalDataError, match="is a symbolic link loop") as info:
        load_local_table(str(path))
    assert str(tmp_path) not in str(info.value) and str(path) in info.value.detail
    with pytest.raises(ConfigError, match="symbolic link loop"):
        validate({"output-dir": str(path)})
    with pytest.raises(ConfigError, match="symbolic link loop"):
        validate({"output-dir": str(path / "run1")})


# ------------------------------------------------------------------ settings

@pytest.mark.parametrize("value, ok", [(0, True), (1, False), (2, True), (5, True)])
def test_fedfcm_local_k_max_below_two_is_refused(value, ok):
    cfg = {"method": "fedfcm", "fedfcm.local-k-max": value}
    if ok:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=r"'fedfcm.local-k-max' = 1.*K >= 2.*0 means"):
            validate(cfg)


def test_fedfcm_local_k_max_below_k_min_is_refused_while_the_local_index_is_on():
    cfg = {"method": "fedfcm", "fedfcm.k-min": 3, "fedfcm.k-max": 5, "fedfcm.local-k-max": 2}
    with pytest.raises(ConfigError, match=r"fedfcm.local-k-max.*>= fedfcm.k-min \(3\)"):
        validate(cfg)
    validate({**cfg, "fedfcm.local-index": False})


def test_a_key_of_another_method_is_refused_naming_its_method():
    # a partial config (API run_config, Hydra override): every key in it was given
    with pytest.raises(ConfigError, match=r"method='exact-fcm': 'fedcref.tau' belong\(s\) to "
                                          r"method='fedcref'.*Fix: remove 'fedcref.tau'"):
        validate({"method": "exact-fcm", "fedcref.tau": 0.3})
    with pytest.raises(ConfigError, match="fcm.n-clusters"):     # even at its default
        validate({"method": "fedfcm", "fcm.n-clusters": 4})
    # the full table flwr run passes (every key, defaults): only values the user changed count
    table = {**defaults(), "method": "exact-fcm"}
    validate(table)
    with pytest.raises(ConfigError, match=r"'fedfcm.k-max' belong\(s\) to method='fedfcm'; "
                                          r"'emdcfl.rounds' belong\(s\) to method='emdcfl'"):
        validate({**table, "fedfcm.k-max": 9, "emdcfl.rounds": 5})
    validate({**table, "fcm.n-clusters": 7})      # its own keys are fine


def test_a_foreign_key_stops_the_python_api_before_any_work(tmp_path):
    from fedclust.api import simulate

    with pytest.raises(ConfigError, match="belong"):
        simulate("exact-fcm", [np.ones((20, 2)), np.zeros((20, 2))], n_clusters=2,
                 output_dir=tmp_path / "out", run_config={"fedfcm.k-max": 9})
    assert not (tmp_path / "out").exists()


def test_dataset_local_without_a_data_path_says_how_to_give_one():
    from client_apps.data import load_client_data
    from fedclust.data.tabular import DatasetError, load_dataset

    cfg = validate({"method": "exact-fcm", "dataset": "local"})
    for node in ({"partition-id": 0, "num-partitions": 2}, {}):
        with pytest.raises(ConfigError) as info:
            load_client_data(_ctx(node, cfg), cfg)
        assert "--node-config 'data-path=" in str(info.value)
        assert "blobs" not in str(info.value)
    with pytest.raises(DatasetError, match="data-path") as info:
        load_dataset({"dataset": "local"})
    assert "blobs" not in str(info.value)


def test_more_clusters_than_rows_is_refused_before_any_work(tmp_path):
    from fedclust.api import simulate
    from strategies.run import check_run_config

    # the dataset's rows are known at the server's preflight
    with pytest.raises(ConfigError, match=r"'fcm.n-clusters' = 12.*dataset 'blobs': 10 row"):
        check_run_config({"method": "exact-fcm", "blobs.n-samples": 10, "fcm.n-clusters": 12})
    with pytest.raises(ConfigError, match=r"'fedfcm.k-max' = 12"):
        check_run_config({"method": "fedfcm", "blobs.n-samples": 10, "fedfcm.k-max": 12})
    # dataset=files: the site files' rows, counted when they are checked
    for i in range(2):
        _write(tmp_path / "sites" / f"s{i}.csv", "1,2\n3,4\n5,6\n")
    with pytest.raises(ConfigError, match=r"site files of data-dir: 6 row"):
        check_run_config({"method": "exact-fcm", "dataset": "files", "fcm.n-clusters": 8,
                          "data-dir": str(tmp_path / "sites")})
    # the probe's repro: 10 clusters on 4 rows, guard off, one client: simulate() holds the
    # rows and refuses before the run (a deployed run's only node refuses on its own)
    with pytest.raises(ConfigError, match=r"'fcm.n-clusters' = 10.*the 1 client array\(s\): "
                                          r"4 row"):
        simulate("exact-fcm", [np.arange(8.0).reshape(4, 2)], n_clusters=10,
                 privacy_guard=False, output_dir=tmp_path / "one")
    assert not (tmp_path / "one").exists()


# ------------------------------------------------------------------ the privacy guard's boundary

@pytest.mark.parametrize("c, f", [(4, 2), (4, 1), (3, 3), (6, 2)])
def test_privacy_guard_boundary_is_inclusive(c, f):
    """N = C(F+1)/F rows (an integer here) are withheld, N + 1 are sent: the rule is ``≤``."""
    from client_apps.fcm_handlers import guard_withholds, settings

    bound = c * (f + 1) // f
    assert bound * f == c * (f + 1)
    cfg = validate({"method": "exact-fcm", "fcm.n-clusters": c})
    assert guard_withholds(settings(cfg), np.zeros((bound, f)))
    assert not guard_withholds(settings(cfg), np.zeros((bound + 1, f)))
    assert not guard_withholds(settings({**cfg, "fcm.privacy-guard": False}),
                               np.zeros((bound, f)))
    fed = validate({"method": "fedfcm", "fedfcm.k-max": c})
    assert guard_withholds(settings(fed), np.zeros((bound, f)))
    assert not guard_withholds(settings(fed), np.zeros((bound + 1, f)))


@pytest.mark.parametrize("rows, withheld", [(6, True), (7, False)])
def test_a_node_at_the_guard_boundary_sends_nothing_and_one_row_more_sends(tmp_path, rows,
                                                                          withheld):
    from flwr.supercore.task_identity import TaskIdentity

    from client_apps.fcm_handlers import fcm_stats

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    path = tmp_path / "n.npz"
    np.savez(path, x=np.random.default_rng(0).random((rows, 2)))     # C = 4, F = 2: 6
    cfg = {"method": "exact-fcm", "fcm.n-clusters": 4, "num-clients": 2}
    msg = Message(RecordDict(), dst_node_id=5, message_type="query.fcm_stats")
    msg.metadata.__dict__["_message_id"] = "m1"
    rep = fcm_stats(msg, _ctx({"data-path": str(path)}, cfg))
    assert ("stats" in rep.content.array_records) is not withheld
    assert rep.content.metric_records["metrics"].get("withheld", 0) == int(withheld)


# ------------------------------------------------------------------ FedCRef and EMD-CFL nodes

def _inflated_npz(path: Path, **arrays) -> Path:
    """An .npz whose directory claims that ``x`` unpacks to ~3.9 GB (a zip bomb's trick)."""
    np.savez(path, **arrays)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        names = [i.filename for i in zf.infolist()]
    at = -1
    for name in names:               # the central directory entry of x.npy
        at = data.index(b"PK\x01\x02", at + 1)
        if name == "x.npy" or name == "x_train.npy":
            struct.pack_into("<I", data, at + 24, 0xF000_0000)
    path.write_bytes(bytes(data))
    return path


IMAGES = np.random.default_rng(0).integers(0, 256, (6, 28, 28)).astype(np.uint8)
LABELS = np.arange(6) % 3


def _with(arr: np.ndarray, index: tuple, value: float) -> np.ndarray:
    out = arr.astype(np.float32)
    out[index] = value
    return out


FEDCREF_BAD = [
    ("nan", lambda p: np.savez(p, x=_with(IMAGES, (2, 3, 4), np.nan), y=LABELS),
     "not a finite number"),
    ("negative-pixel", lambda p: np.savez(p, x=_with(IMAGES, (1, 0, 0), -1.0)),
     "row 2, column 1 is not a pixel value"),
    ("pixel-above-255", lambda p: np.savez(p, x=_with(IMAGES, (0, 0, 5), 300.0)),
     "outside [0, 255]"),
    ("oversized", lambda p: _inflated_npz(p, x=IMAGES), "over the limit"),
    ("labels-wrong-shape", lambda p: np.savez(p, x=IMAGES, y=LABELS[:4]),
     "'y' has 4 labels but 'x' has 6 rows"),
    ("no-images", lambda p: np.savez(p, x=np.zeros((0, 28, 28))), "no data rows"),
    ("labels-not-class-numbers", lambda p: np.savez(p, x=IMAGES, y=-LABELS - 1),
     "not a class number"),
    ("pickled", lambda p: np.savez(p, x=np.array([[SECRET_HEADER]], dtype=object)),
     "pickled"),
]


@pytest.mark.parametrize("build, fragment", [c[1:] for c in FEDCREF_BAD],
                         ids=[c[0] for c in FEDCREF_BAD])
def test_a_fedcref_node_refuses_bad_data_through_the_door(tmp_path, build, fragment):
    from client_apps import fedcref_handlers

    path = tmp_path / "Jane_Doe.npz"
    build(path)
    cfg = validate({"method": "fedcref", "dataset": "local"})
    fedcref_handlers._deployment_data.cache_clear()
    reason = _reply_reason(lambda: fedcref_handlers._data(_ctx({"data-path": str(path)}, cfg),
                                                          cfg), "train.fedcref_init")
    assert reason.startswith("LocalDataError: ") and fragment in reason, reason
    assert_public(reason, str(tmp_path), "Jane_Doe")


def test_a_fedcref_node_reads_pixels_as_the_former_loader_did(tmp_path):
    from client_apps import fedcref_handlers

    np.savez(tmp_path / "a.npz", x=IMAGES, y=LABELS)
    fedcref_handlers._deployment_data.cache_clear()
    x, y = fedcref_handlers._deployment_data(str(tmp_path / "a.npz"))
    assert x.dtype == np.float32 and x.shape == (6, 784)
    np.testing.assert_array_equal(x, IMAGES.reshape(6, -1).astype(np.float32) / 255.0)
    assert y.tolist() == LABELS.tolist()
    np.savez(tmp_path / "b.npz", x=IMAGES / 255.0)           # already in [0, 1]: kept
    x, y = fedcref_handlers._deployment_data(str(tmp_path / "b.npz"))
    np.testing.assert_array_equal(x, (IMAGES / 255.0).reshape(6, -1).astype(np.float32))
    assert y is None


def _splits(**change) -> dict[str, np.ndarray]:
    parts = {"x_train": IMAGES, "y_train": LABELS, "x_val": IMAGES[:2], "y_val": LABELS[:2],
             "x_test": IMAGES[:3], "y_test": LABELS[:3], "cluster": np.int64(1)}
    parts.update(change)
    return {k: v for k, v in parts.items() if v is not None}


EMDCFL_BAD = [
    ("nan", lambda p: np.savez(p, **_splits(x_val=_with(IMAGES[:2], (1, 5, 5), np.nan))),
     "'x_val' image 2 holds a value that is not a pixel value"),
    ("inf", lambda p: np.savez(p, **_splits(x_test=_with(IMAGES[:3], (0, 0, 0), np.inf))),
     "'x_test' image 1"),
    ("oversized", lambda p: _inflated_npz(p, **_splits()), "over the limit"),
    ("wrong-image-shape", lambda p: np.savez(p, **_splits(x_train=IMAGES[:, :27])),
     "images of shape (27, 28). Allowed: (rows, 28, 28)"),
    ("rgb-for-a-grey-model", lambda p: np.savez(
        p, **_splits(x_train=np.repeat(IMAGES[..., None], 3, axis=3))), "images of shape"),
    ("labels-wrong-length", lambda p: np.savez(p, **_splits(y_train=LABELS[:5])),
     "'y_train' has 5 labels but 'x_train' has 6 rows"),
    ("label-beyond-the-classes", lambda p: np.savez(p, **_splits(y_test=np.array([0, 1, 10]))),
     "'y_test': the label of row 3 is not a class number in 0..9"),
    ("missing-split", lambda p: np.savez(p, **_splits(x_val=None)), "lacks ['x_val']"),
    ("cluster-not-an-int", lambda p: np.savez(p, **_splits(cluster=np.array([0.5, 1]))),
     "'cluster' has dtype float64"),
    ("not-an-npz", lambda p: p.write_text(SECRET_HEADER), "not a valid .npz archive"),
]


@pytest.mark.parametrize("build, fragment", [c[1:] for c in EMDCFL_BAD],
                         ids=[c[0] for c in EMDCFL_BAD])
def test_an_emdcfl_node_refuses_bad_data_through_the_door(tmp_path, build, fragment):
    from client_apps import emdcfl_handlers

    path = tmp_path / "Jane_Doe.npz"
    build(path)
    cfg = validate({"method": "emdcfl", "dataset": "local", "emdcfl.preflight": False})
    emdcfl_handlers._from_file.cache_clear()
    reason = _reply_reason(lambda: emdcfl_handlers.client_data(
        _ctx({"data-path": str(path)}, cfg), cfg), "train.emdcfl_local")
    assert reason.startswith("LocalDataError: ") and fragment in reason, reason
    assert_public(reason, str(tmp_path), "Jane_Doe")


def test_an_emdcfl_node_reads_its_splits_unchanged(tmp_path):
    from client_apps import emdcfl_handlers

    np.savez(tmp_path / "c.npz", **_splits())
    cfg = validate({"method": "emdcfl", "dataset": "local", "emdcfl.preflight": False})
    emdcfl_handlers._from_file.cache_clear()
    split = emdcfl_handlers.client_data(_ctx({"data-path": str(tmp_path / "c.npz")}, cfg), cfg)
    assert split.x_train.dtype == np.uint8
    np.testing.assert_array_equal(split.x_train, IMAGES)
    assert split.y_val.tolist() == LABELS[:2].tolist() and split.cluster == 1
    part = load_image_arrays(str(tmp_path / "c.npz"), {"x_train": "y_train"}, [(28, 28)], 3)
    assert part["y_train"].dtype == np.int64 and "x_val" not in part


def test_a_sweep_drops_what_a_dataset_file_sets_for_other_methods_but_not_what_the_user_sets(
        tmp_path):
    """conf/dataset/iris.yaml sets fcm.n-clusters for every method: a FedCRef or FedFCM job
    does not carry it, while a foreign key on the command line is refused."""
    from hydra import compose, initialize_config_dir

    from server_app.sweep import CONF_DIR, job_run_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[
            "method=fedfcm", "dataset=iris", "+app.fedcref.tau=0.3", f"app.output-dir={tmp_path}"])
    assert cfg.app.fcm["n-clusters"] == 3
    composed = job_run_config(cfg.app, given=set())
    assert "fcm.n-clusters" not in composed and "fedcref.tau" not in composed
    assert composed["fedfcm.k-max"] == 6
    validate(composed)
    with pytest.raises(ConfigError, match=r"'fedcref.tau' belong\(s\) to method='fedcref'"):
        validate(job_run_config(cfg.app, given={"fedcref.tau"}))


@pytest.mark.parametrize("header", ["pw,pl,sw,sl,label", "sl,sw,pl,pw,label"])
def test_a_site_whose_columns_are_in_another_order_is_excluded_not_summed(tmp_path, header):
    """Probe: three sites with the same header names, one in another order, were summed
    column by column (ARI 0.72 -> 0.27, no word). Each node sends a digest of its column
    names (never the names); the one that differs from the others is excluded, named."""
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    nodes = []
    for i in range(3):
        cols = [3, 2, 1, 0] if i == 2 and header.startswith("pw") else [0, 1, 2, 3]
        rows = "\n".join(",".join(map(str, r[cols])) + f",{c}" for r, c in zip(x[i::3], y[i::3]))
        path = _write(tmp_path / f"site{i}.csv",
                      f"{header if i == 2 else 'sl,sw,pl,pw,label'}\n{rows}\n")
        nodes.append({"data-path": str(path), "label-column": "label",
                      "allow-evaluation": True})
    summary, _ = run_server({"method": "exact-fcm", "dataset": "local", "fcm.n-clusters": 3,
                             "num-clients": 3, "output-dir": str(tmp_path / "out"),
                             "plots": False}, node_configs=nodes)
    excluded = summary["excluded_nodes"]
    if header.startswith("sl"):               # the same columns everywhere: nobody excluded
        assert excluded == []
        return
    assert {e["node"] for e in excluded} == {excluded[0]["node"]}, excluded
    assert "feature columns differ" in excluded[0]["reason"] and excluded[0]["phase"] == "scaling"
    assert "pw" not in json.dumps(summary)    # the names stay on the nodes
