import numpy as np
import pytest

from fedclust.data import partition, scaling
from fedclust.data.tabular import MOTIVATIONAL_RECIPE, DatasetError, load_dataset

BASE = {"seed": 0, "data-dir": "", "blobs.n-samples": 300, "blobs.centers": 3,
        "blobs.n-features": 2, "blobs.std": 1.0, "g2.dim": 2, "g2.sigma": 10}


def _covers_exactly(parts, n):
    allidx = np.concatenate(parts)
    return allidx.size == n and np.unique(allidx).size == n


def test_iid_partition_is_a_seeded_near_equal_split():
    parts = partition.iid(103, 10, seed=1)
    assert _covers_exactly(parts, 103)
    assert {len(p) for p in parts} <= {10, 11}
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition.iid(103, 10, seed=1)))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, partition.iid(103, 10, seed=2)))


def test_stratified_partition_keeps_class_shares():
    y = np.repeat([0, 1, 2], [200, 100, 60])
    parts = partition.stratified(y, 20, seed=0)
    assert _covers_exactly(parts, y.size)
    for p in parts:
        counts = np.bincount(y[p], minlength=3)
        assert np.all(np.abs(counts - np.array([10, 5, 3])) <= 1)


def test_dirichlet_partition_skews_labels_and_respects_min_size():
    y = np.repeat(np.arange(5), 200)
    parts = partition.dirichlet(y, 8, alpha=0.1, seed=0)
    assert _covers_exactly(parts, y.size)
    assert min(len(p) for p in parts) >= 2
    dominant = [np.bincount(y[p], minlength=5).max() / len(p) for p in parts]
    assert np.mean(dominant) > 0.5          # strong skew at alpha 0.1
    wide = partition.dirichlet(y, 8, alpha=100.0, seed=0)
    assert np.mean([np.bincount(y[p], minlength=5).max() / len(p) for p in wide]) < 0.35


def test_column_partition_needs_one_client_per_value():
    groups = np.array([0, 0, 1, 2, 2, 2])
    parts = partition.by_column(groups, 3)
    assert [list(p) for p in parts] == [[0, 1], [2], [3, 4, 5]]
    with pytest.raises(partition.PartitionError, match="num-clients=3"):
        partition.by_column(groups, 4)


def test_motivational_recipe_is_the_papers_example():
    ds = load_dataset({**BASE, "dataset": "motivational"})
    assert ds.x.shape == (3120, 2) and np.bincount(ds.y).tolist() == [500, 1000, 500, 1000, 120]
    parts = partition.recipe(ds.y, MOTIVATIONAL_RECIPE, seed=0)
    assert [np.bincount(ds.y[p], minlength=5).tolist() for p in parts] == [
        [500, 500, 0, 0, 40], [0, 500, 0, 500, 40], [0, 0, 500, 500, 40]]
    assert np.unique(np.concatenate(parts)).size == sum(len(p) for p in parts)   # disjoint
    small = ds.y == 4
    np.testing.assert_allclose(ds.x[small].mean(0), [0.5, 0.5], atol=0.01)


@pytest.mark.parametrize("kind", ["minmax", "standard"])
def test_federated_scaling_equals_pooled_scaling(kind):
    from sklearn.preprocessing import MinMaxScaler, StandardScaler

    rng = np.random.default_rng(0)
    x = rng.normal(loc=[0, 100, -5], scale=[1, 50, 0.1], size=(500, 3))
    parts = partition.iid(500, 7, 0)
    total = scaling.combine([scaling.column_stats(x[p]) for p in parts])
    shift, scale = scaling.scaler(total, kind)
    ref = (MinMaxScaler() if kind == "minmax" else StandardScaler()).fit_transform(x)
    np.testing.assert_allclose(scaling.apply(x, shift, scale), ref, atol=1e-10)


def test_missing_files_give_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="data-dir' is empty"):
        load_dataset({**BASE, "dataset": "xclara"})
    with pytest.raises(DatasetError, match="does not contain"):
        load_dataset({**BASE, "dataset": "pendigits", "data-dir": str(tmp_path)})
    with pytest.raises(DatasetError, match="Allowed"):
        load_dataset({**BASE, "dataset": "nope"})


@pytest.mark.parametrize("name, shape, n_classes", [
    ("xclara", (3000, 2), 3), ("s-set1", (5000, 2), 15), ("pendigits", (10992, 16), 10),
    ("waveform", (5000, 21), 3)])
def test_benchmark_files_load(data_dir, name, shape, n_classes):
    ds = load_dataset({**BASE, "dataset": name, "data-dir": str(data_dir / "clustering")
                       if name in ("xclara", "s-set1") else str(data_dir / "uci")})
    assert ds.x.shape == shape and ds.n_classes == n_classes


def test_g2_and_bank_files_load(data_dir):
    g2 = load_dataset({**BASE, "dataset": "g2", "g2.dim": 16, "g2.sigma": 30,
                       "data-dir": str(data_dir)})
    assert g2.x.shape == (2048, 16) and np.bincount(g2.y).tolist() == [1024, 1024]
    bank = load_dataset({**BASE, "dataset": "bank", "data-dir": str(data_dir)})
    assert bank.x.shape == (43193, 3)                  # paper 003 §3.2.3: 43,193 rows
    sizes = dict(zip(sorted({"admin.", "blue-collar", "entrepreneur", "housemaid", "management",
                             "retired", "self-employed", "services", "student", "technician",
                             "unemployed"}), np.bincount(bank.groups["job"]).tolist()))
    assert sizes["management"] == 9216 and sizes["student"] == 775 and len(sizes) == 11


def test_local_node_files(tmp_path):
    from fedclust.data.local import LocalDataError, load_local_table

    np.savez(tmp_path / "a.npz", x=np.ones((4, 2)), y=np.arange(4))
    x, y = load_local_table(str(tmp_path / "a.npz"))
    assert x.shape == (4, 2) and y.tolist() == [0, 1, 2, 3]
    (tmp_path / "b.csv").write_text("f1,f2,label\n1,2,0\n3,4,1\n")
    x, y = load_local_table(str(tmp_path / "b.csv"), label_column="label")
    assert x.tolist() == [[1, 2], [3, 4]] and y.tolist() == [0, 1]
    x, y = load_local_table(str(tmp_path / "b.csv"))
    assert x.shape == (2, 3) and y is None
    with pytest.raises(LocalDataError, match="does not exist"):
        load_local_table(str(tmp_path / "missing.csv"))


def test_image_folder_node_data(tmp_path):
    from PIL import Image

    from fedclust.data.local import load_local_table

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(2):
            Image.fromarray(np.full((4, 4), 255 * (label == "dog"), dtype=np.uint8)).save(
                tmp_path / label / f"{i}.png")
    x, y = load_local_table(str(tmp_path))
    assert x.shape == (4, 16) and y.tolist() == [0, 0, 1, 1]
    assert x[:2].max() == 0.0 and x[2:].min() == 1.0


def test_client_app_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, client_apps.app; heavy = [m for m in ('torch', 'sklearn') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing the ClientApp pulls in {out.stdout.strip()}"


def test_local_files_edge_cases(tmp_path):
    """Nested class folders, string labels, and clear errors for a label column that is not
    there (audit of fedclust/data/local.py)."""
    from PIL import Image

    from fedclust.data.local import LocalDataError, load_local_table

    img = tmp_path / "imgs"
    for path in ("a/sub/x.png", "a/y.png", "b/deeper/still/z.png"):
        (img / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((2, 2), dtype=np.uint8)).save(img / path)
    _, y = load_local_table(str(img))
    assert y.tolist() == [0, 0, 1]            # sorted files: a/sub/x, a/y, b/deeper/still/z
    (tmp_path / "s.csv").write_text("f1,f2,label\n1,2,cat\n3,4,dog\n5,6,cat\n")
    x, y = load_local_table(str(tmp_path / "s.csv"), label_column="label")
    assert x.tolist() == [[1, 2], [3, 4], [5, 6]] and y.tolist() == [0, 1, 0]
    (tmp_path / "i.tsv").write_text("7\t1\t2\n1\t3\t4\n")
    x, y = load_local_table(str(tmp_path / "i.tsv"), label_column="0")
    assert x.tolist() == [[1, 2], [3, 4]] and y.tolist() == [7, 1]
    (tmp_path / "n.csv").write_text("1,2,0\n3,4,1\n")
    with pytest.raises(LocalDataError, match="no header row.*0-based column index"):
        load_local_table(str(tmp_path / "n.csv"), label_column="label")
    with pytest.raises(LocalDataError, match="out of range"):
        load_local_table(str(tmp_path / "n.csv"), label_column="3")
    with pytest.raises(LocalDataError, match="header has 3 column\\(s\\), none named 'class'"):
        load_local_table(str(tmp_path / "s.csv"), label_column="class")
    with pytest.raises(LocalDataError, match="label-column"):
        load_local_table(str(tmp_path / "s.csv"))          # text labels, no label column
    np.savez(tmp_path / "t.npz", x=np.ones((3, 2)), y=np.array(["dog", "cat", "dog"]))
    assert load_local_table(str(tmp_path / "t.npz"))[1].tolist() == [1, 0, 1]
