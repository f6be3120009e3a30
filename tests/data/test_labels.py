"""Labels of any type, coded once: :func:`fedclust.data.local.label_values` takes labels as a
user holds them (lists, numpy arrays, pandas Series of any dtype, Hugging Face columns) and
:func:`fedclust.data.local.label_codes` codes each label on its own, so every client and every
path (``simulate``, ``dataset="files"``, a deployed node) gives a label one code."""

from __future__ import annotations

import numpy as np
import pytest

import fedclust
from fedclust.api import _class_numbers
from fedclust.config import ConfigError
from fedclust.data.local import LocalDataError, label_codes, label_values, load_local_table

pd = pytest.importorskip("pandas")


@pytest.mark.parametrize(("values", "expected"), [
    (["flu", "sick"], np.array(["flu", "sick"])),
    (pd.Series(["flu", "sick"], dtype="category"), np.array(["flu", "sick"])),
    (pd.Series([3, 1], dtype="category"), np.array([3, 1])),
    (pd.Series(["flu", "sick"], dtype="string"), np.array(["flu", "sick"])),
    (pd.Series([True, False]), np.array([True, False])),
    (pd.Series([2, 5], dtype="Int64"), np.array([2, 5])),
    (np.array(["a", "b"], dtype=object), np.array(["a", "b"])),
    ([b"a", b"b"], np.array(["a", "b"])),
])
def test_labels_are_taken_as_the_user_holds_them(values, expected):
    got = label_values(values)
    np.testing.assert_array_equal(got, expected)
    assert got.dtype.kind in "biufU"       # storable in an .npz without pickle


@pytest.mark.parametrize(("values", "match"), [
    (pd.Series(["flu", None]), "row 2 is missing"),
    (pd.Series([1, None], dtype="Int64"), "row 2 is missing"),
    (pd.Series(["flu", np.nan]), "row 2 is missing"),
    (np.array(["flu", 3], dtype=object), "mix numbers, text"),
    (np.array([{"a": 1}], dtype=object), "row 1 holds an object"),
])
def test_missing_and_mixed_labels_are_refused_with_the_row(values, match):
    with pytest.raises(LocalDataError, match=match):
        label_values(values)


def test_a_label_gets_one_code_whatever_else_a_client_holds():
    a = label_codes(pd.Series(["sick", "flu"], dtype="category"))
    b = label_codes(["flu", "healthy", "sick"])
    assert a[0] == b[2] and a[1] == b[0]
    np.testing.assert_array_equal(label_codes(np.array([True, False])), [1, 0])
    np.testing.assert_array_equal(label_codes(pd.Series([2, 7])), [2, 7])   # kept as they are


def test_simulate_writes_text_labels_the_node_reads_back(tmp_path):
    """The file a simulated client reads holds the labels as text (no pickle), so its loader
    codes them as a deployed node codes its own file's."""
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 1)), y=label_values(["flu", "sick"]))
    _, y = load_local_table(str(tmp_path / "c.npz"), stable_labels=True)
    np.testing.assert_array_equal(y, label_codes(["flu", "sick"]))


def test_simulate_refuses_a_missing_label_naming_the_client(tmp_path):
    x = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ConfigError, match="client 1's labels: the label of row 3 is not a finite"):
        fedclust.simulate("exact-fcm", [x, x], [np.zeros(20), np.r_[0, 1, np.nan, np.ones(17)]],
                          n_clusters=2, output_dir=tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_class_methods_number_text_labels_by_one_vocabulary():
    numbers, classes = _class_numbers([label_values(["sick", "flu"]),
                                       label_values(["healthy", "flu"])], 9)
    assert sorted(classes) == ["flu", "healthy", "sick"]
    assert [classes[k] for k in numbers[0]] == ["sick", "flu"]
    assert [classes[k] for k in numbers[1]] == ["healthy", "flu"]
    kept, none = _class_numbers([label_values([3, 1]), label_values([0])], 9)
    assert none is None and kept[0].tolist() == [3, 1]     # class numbers stay as given
    with pytest.raises(ConfigError, match="11 distinct classes; this method takes at most 10"):
        _class_numbers([label_values([f"c{i}" for i in range(11)])], 9)


@pytest.mark.slow
def test_fedcref_and_emdcfl_run_on_text_labels(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    words = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                      "nine"])
    idx = np.random.default_rng(0).permutation(len(digits.target))[:600]
    images, names = digits.images[idx] * 15, words[digits.target[idx]]
    parts = np.array_split(np.arange(600), 3)
    res = fedclust.simulate(
        "fedcref", [images[p].reshape(len(p), -1) for p in parts], [names[p] for p in parts],
        output_dir=tmp_path / "fedcref", max_iterations=1, fl_rounds=1, ae_epochs=2,
        ae_patience=0, batch_size=16, fl_local_epochs=1, k_estimate_max=3,
        run_config={"plots": False})
    assert res.metrics["eval_nodes"] == 3 and sorted(res.classes) == sorted(words)
    assert "classes" not in res.summary["data"]      # evaluation labels: in memory only
    res = fedclust.simulate(
        "emdcfl", [images[p] for p in parts], [names[p] for p in parts], dataset="rotdigits",
        output_dir=tmp_path / "emdcfl", rounds=2, local_epochs=1, conv1=4, conv2=8,
        embed_dim=16, workers=1, run_config={"plots": False})
    assert sorted(res.classes) == sorted(words) and res.metrics["num_clusters"] >= 1
    import json

    saved = json.loads((res.run_dir / "summary.json").read_text())["data"]["classes"]
    assert saved == res.classes        # the run folder says what each predicted class means


def test_emdcfl_mapping_clients_get_one_class_vocabulary():
    from fedclust.api import _mapping_classes

    clients = [{"x_train": 0, "y_train": ["cat", "dog"], "y_val": ["dog"], "y_test": ["cat"]},
               {"x_train": 0, "y_train": ["bird"], "y_val": ["cat"], "y_test": ["bird"]}]
    out, classes = _mapping_classes(clients)
    assert sorted(classes) == ["bird", "cat", "dog"]
    assert [classes[k] for k in out[0]["y_train"]] == ["cat", "dog"]
    assert [classes[k] for k in out[1]["y_test"]] == ["bird"]
    same, none = _mapping_classes([{"y_train": [0, 3], "y_val": [1], "y_test": [2]}])
    assert none is None and same[0]["y_train"] == [0, 3]      # class numbers stay


def _pixel_site(path, labels) -> np.ndarray:
    """A FedCRef site table: 16 pixel columns and a ``digit`` label column."""
    rng = np.random.default_rng(len(labels))
    x = rng.integers(0, 256, (len(labels), 16))
    frame = pd.DataFrame(x, columns=[f"p{i}" for i in range(16)])
    frame["digit"] = labels
    frame.to_csv(path, index=False)
    return x


def test_a_deployed_fedcref_node_keeps_its_label_column_out_of_the_pixels(tmp_path):
    """Node config ``label-column`` (and ``dataset="files"``'s ``files.label-column``) names
    the ground truth on a FedCRef node as on an FCM node: never a pixel column."""
    from flwr.app import Context, RecordDict

    from client_apps import fedcref_handlers
    from fedclust.config import validate

    x = _pixel_site(tmp_path / "site.csv", [3, 1, 4, 1, 5, 9, 2, 6])
    cfg = validate({"method": "fedcref", "dataset": "local"})
    node = {"data-path": str(tmp_path / "site.csv"), "label-column": "digit",
            "allow-evaluation": True}
    ctx = Context(run_id=1, node_id=5, node_config=node, state=RecordDict(), run_config={})
    fedcref_handlers._deployment_data.cache_clear()
    got, y, _ = fedcref_handlers._data(ctx, cfg)
    assert got.shape == (8, 16)
    np.testing.assert_allclose(got, x / 255.0, rtol=1e-6)
    assert y.tolist() == [3, 1, 4, 1, 5, 9, 2, 6]
