"""A node's data is checked at the door (fedclust/data/local.py): every refusal is a
LocalDataError whose message names the place by its kind only (never the file's path or name:
that is in the error's ``detail``, for the node's log) and never quotes the data (cells,
labels, bytes, lines), and what is accepted loads correctly (16-bit images, node-independent
label codes)."""

from __future__ import annotations

import os
import socket
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedclust.data.local import (
    MAX_ABS,
    TEXT_CODE_BASE,
    LocalDataError,
    compact_codes,
    label_codes,
    labels_to_int,
    load_local_table,
)

SECRET = "PATIENT_SMITH"
# Text that would betray that an exception's own message (which quotes data) was passed on.
LEAKS = (SECRET, "could not convert", "can't decode", "invalid start byte", "Traceback",
         "1e+308", "1e308", "1e+200", "123456.789", "7777")


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _png(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    (Image.fromarray(arr, mode) if mode else Image.fromarray(arr)).save(path)
    return path


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _link(path: Path, target: str | Path) -> Path:
    os.symlink(target, path)
    return path


def _truncated_npz(path: Path) -> Path:
    np.savez(path, x=np.arange(2000.0).reshape(1000, 2))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _corrupt_member_npz(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", b"\x93NUMPY garbage " + SECRET.encode())
    return path


def _truncated_npy(path: Path) -> Path:
    np.save(path, np.arange(2000.0).reshape(1000, 2))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _bad_header_npy(path: Path) -> Path:
    return _write(path, b"\x93NUMPY\x01\x00\x20\x00{'descr': " + SECRET.encode() + b"}    \n")


def _mode_f_tiff(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((3, 3), 0.5, dtype=np.float32), "F").save(path)
    return path


def _mode_i_tiff(path: Path, value: int) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((3, 3), value, dtype=np.int32), "I").save(path)
    return path


def _images_of_two_sizes(root: Path) -> Path:
    _png(root / "a.png", np.zeros((3, 3), np.uint8))
    _png(root / "b.png", np.zeros((4, 4), np.uint8))
    return root


# (id, builder(tmp_path) -> data path, kwargs, a fragment the message must contain,
#  the name the detail must contain and the message must not ("" = the data path's own name))
REFUSED = [
    # ---- csv / tsv
    ("csv-text-cell", lambda t: _write(t / "s.csv", f"a,b\n1,2\n3,{SECRET}\n"), {},
     "line 3, column 2 is not a number", ""),
    ("csv-text-cell-hint", lambda t: _write(t / "s.csv", f"1,2\n{SECRET},4\n"), {},
     "label-column", ""),
    ("csv-text-cell-with-label", lambda t: _write(t / "s.csv", f"a,b,l\n1,2,x\n{SECRET},4,y\n"),
     {"label_column": "l"}, "only the label column may hold text", ""),
    ("tsv-text-cell", lambda t: _write(t / "s.tsv", f"1\t2\n3\t{SECRET}\n"), {},
     "line 2, column 2 is not a number", ""),
    ("csv-ragged-short", lambda t: _write(t / "s.csv", f"1,2,3\n4,5\n{SECRET},1,1\n"), {},
     "line 2 has 2 field(s) but line 1 has 3", ""),
    ("csv-ragged-long", lambda t: _write(t / "s.csv", f"x,y\n1,2\n3,4,{SECRET}\n"), {},
     "line 3 has 3 field(s) but line 2 has 2", ""),
    ("csv-ragged-with-label", lambda t: _write(t / "s.csv", f"a,l\n1,{SECRET}\n2\n"),
     {"label_column": "l"}, "line 3 has 1 field(s)", ""),
    ("csv-empty-cell", lambda t: _write(t / "s.csv", "1,,3\n4,5,6\n"), {},
     "line 1, column 2 is empty", ""),
    ("csv-nan", lambda t: _write(t / "s.csv", "a,b\n1,2\n3,nan\n"), {},
     "line 3 (data row 2), column 2 is not a finite number", ""),
    ("csv-inf", lambda t: _write(t / "s.csv", "1,inf\n3,4\n"), {}, "not a finite number", ""),
    ("csv-minus-inf", lambda t: _write(t / "s.csv", "1,2\n-inf,4\n"), {},
     "line 2 (data row 2), column 1", ""),
    ("csv-overflowing-square", lambda t: _write(t / "s.csv", "1,1e308\n3,4\n"), {},
     "magnitude above 1e+150", ""),
    ("csv-parses-to-inf", lambda t: _write(t / "s.csv", "1,2\n1e400,4\n"), {},
     "not a finite number", ""),
    ("csv-huge-with-comment-lines", lambda t: _write(t / "s.csv", "# note\n1,2\n\n-1e200,4\n"),
     {}, "line 4 (data row 2), column 1 has a magnitude", ""),
    ("csv-nan-with-label", lambda t: _write(t / "s.csv", f"a,b,l\n1,nan,{SECRET}\n"),
     {"label_column": "l"}, "line 2 (data row 1), column 2", ""),
    ("csv-empty-file", lambda t: _write(t / "s.csv", ""), {}, "is empty", ""),
    ("csv-header-only", lambda t: _write(t / "s.csv", "a,b,c\n"), {}, "no data rows", ""),
    ("csv-comments-only", lambda t: _write(t / "s.csv", f"# {SECRET}\n\n"), {},
     "no data rows", ""),
    ("csv-label-column-only", lambda t: _write(t / "s.csv", f"l\n{SECRET}\nb\n"),
     {"label_column": "l"}, "no feature columns", ""),
    ("csv-not-utf8", lambda t: _write(t / "s.csv", b"1,2\n3,\xff\xfe" + SECRET.encode() + b"\n"),
     {}, "not UTF-8 text", ""),
    ("csv-nan-label", lambda t: _write(t / "s.csv", "a,l\n1,2\n3,nan\n"), {"label_column": "l"},
     "the label of row 2 is not a finite number", ""),
    ("csv-label-column-no-header", lambda t: _write(t / "s.csv", "123456.789,2\n"),
     {"label_column": "label"}, "no header row (its first cell is a number)", ""),
    ("csv-is-a-folder", lambda t: (t / "d.csv").mkdir() or t / "d.csv", {"data_format": "csv"},
     "is a folder", ""),
    ("csv-over-max-bytes", lambda t: _write(t / "s.csv", "1,2\n" * 100), {"max_bytes": 100},
     "400 bytes, over the limit of 100 bytes", ""),
    ("csv-fifo", lambda t: _fifo(t / "s.csv"), {}, "a FIFO (named pipe), not a regular file", ""),
    ("csv-socket", lambda t: _socket(t / "s.csv"), {}, "a socket, not a regular file", ""),
    ("dev-zero", lambda t: Path("/dev/zero"), {"data_format": "csv"},
     "is a device, not a regular file", "/dev/zero"),
    ("link-to-dev-zero", lambda t: _link(t / "s.csv", "/dev/zero"), {},
     "a symbolic link that points to a device", ""),
    ("link-to-fifo", lambda t: _link(t / "s.npz", _fifo(t / "pipe")), {},
     "points to a FIFO", ""),
    ("broken-link", lambda t: _link(t / "s.csv", t / "gone.csv"), {}, "broken link", ""),
    ("unknown-format", lambda t: _write(t / "s.xlsx", SECRET), {}, "unsupported data format", ""),
    # ---- npz
    ("npz-not-a-zip", lambda t: _write(t / "s.npz", f"x,{SECRET}\n"), {},
     "not a valid .npz archive", ""),
    ("npz-truncated", lambda t: _truncated_npz(t / "s.npz"), {}, ".npz", ""),
    ("npz-corrupt-member", lambda t: _corrupt_member_npz(t / "s.npz"), {}, "malformed", ""),
    ("npz-no-x", lambda t: _npz(t / "s.npz", features=np.ones((2, 2))), {},
     "has 1 array(s) but lacks ['x']", ""),
    ("npz-zero-rows", lambda t: _npz(t / "s.npz", x=np.zeros((0, 3))), {}, "no data rows", ""),
    ("npz-zero-features", lambda t: _npz(t / "s.npz", x=np.zeros((3, 0))), {},
     "no feature columns", ""),
    ("npz-scalar-x", lambda t: _npz(t / "s.npz", x=np.float64(7777)), {}, "single number", ""),
    ("npz-y-length", lambda t: _npz(t / "s.npz", x=np.ones((3, 2)), y=np.arange(2)), {},
     "'y' has 2 labels but 'x' has 3 rows", ""),
    ("npz-y-2d", lambda t: _npz(t / "s.npz", x=np.ones((3, 2)), y=np.ones((3, 2))), {},
     "one label per row", ""),
    ("npz-pickled-x", lambda t: _npz(t / "s.npz", x=np.array([[SECRET, 1]], dtype=object)), {},
     "pickled", ""),
    ("npz-text-x", lambda t: _npz(t / "s.npz", x=np.array([[SECRET, "1"]])), {},
     "not a real number type", ""),
    ("npz-complex-x", lambda t: _npz(t / "s.npz", x=np.ones((2, 2), complex)), {},
     "not a real number type", ""),
    ("npz-nan-x", lambda t: _npz(t / "s.npz", x=np.array([[1.0, 2.0], [np.nan, 1.0]])), {},
     "x row 2, column 1 is not a finite number", ""),
    ("npz-huge-x", lambda t: _npz(t / "s.npz", x=np.array([[1.0, 1e200]])), {},
     "x row 1, column 2 has a magnitude above", ""),
    ("npz-float32-inf", lambda t: _npz(t / "s.npz", x=np.array([[np.inf]], np.float32)), {},
     "not a finite number", ""),
    ("npz-nan-y", lambda t: _npz(t / "s.npz", x=np.ones((2, 1)), y=np.array([1.0, np.nan])), {},
     "the label of row 2 is not a finite number", ""),
    ("npz-unpacks-over-limit",
     lambda t: np.savez_compressed(t / "s.npz", x=np.zeros((500, 100))) or t / "s.npz",
     {"max_bytes": 50_000}, "unpacks to", ""),
    # ---- npy
    ("npy-not-npy", lambda t: _write(t / "s.npy", f"{SECRET},1\n"), {}, "no NumPy header", ""),
    ("npy-is-npz", lambda t: _npz(t / "s.npz", x=np.ones((2, 2))).rename(t / "s.npy") or
     t / "s.npy", {}, "is an .npz archive", ""),
    ("npy-truncated", lambda t: _truncated_npy(t / "s.npy"), {}, "truncated", ""),
    ("npy-bad-header", lambda t: _bad_header_npy(t / "s.npy"), {}, "malformed .npy header", ""),
    ("npy-pickled", lambda t: np.save(t / "s.npy", np.array([SECRET, 1], dtype=object)) or
     t / "s.npy", {}, "pickled", ""),
    ("npy-zero-rows", lambda t: np.save(t / "s.npy", np.zeros((0, 4))) or t / "s.npy", {},
     "no data rows", ""),
    ("npy-inf", lambda t: np.save(t / "s.npy", np.array([1.0, -np.inf])) or t / "s.npy", {},
     "x row 2, column 1 is not a finite number", ""),
    ("npy-over-limit", lambda t: np.save(t / "s.npy", np.zeros((100, 10))) or t / "s.npy",
     {"max_bytes": 1000}, "over the limit of 1000 bytes", ""),
    # ---- image folders
    ("images-none", lambda t: _write(t / "imgs" / "notes.txt", SECRET).parent, {},
     "no images", "imgs"),
    ("images-damaged", lambda t: _write(t / "imgs" / "a" / "bad.png", SECRET).parents[1], {},
     "cannot be read as an image", "bad.png"),
    ("images-float-mode", lambda t: _mode_f_tiff(t / "imgs" / "f.tif").parent, {},
     "image mode 'F' is not supported", "f.tif"),
    ("images-int32-out-of-range", lambda t: _mode_i_tiff(t / "imgs" / "i.tif", 70000).parent,
     {}, "outside 0..65535", "i.tif"),
    ("images-fifo-entry", lambda t: (_png(t / "imgs" / "a.png", np.zeros((2, 2), np.uint8)),
                                     _fifo(t / "imgs" / "p.png"))[1].parent, {},
     "FIFO (named pipe), not a regular file", "p.png"),
    ("images-link-to-device", lambda t: (_png(t / "imgs" / "a.png", np.zeros((2, 2), np.uint8)),
                                         _link(t / "imgs" / "z.png", "/dev/zero"))[1].parent,
     {}, "points to a device", "z.png"),
    ("images-two-sizes", lambda t: _images_of_two_sizes(t / "imgs"), {}, "different sizes",
     "imgs"),
    ("images-over-limit", lambda t: _png(t / "imgs" / "a.png", np.arange(4096, dtype=np.uint8)
                                         .reshape(64, 64) * 37).parent, {"max_bytes": 100},
     "over the limit of 100 bytes", "a.png"),
    ("images-format-on-a-file", lambda t: _write(t / "s.csv", "1,2\n"),
     {"data_format": "images"}, "not a folder", ""),
]


@pytest.mark.parametrize("build, kwargs, fragment, name",
                         [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_refused_with_a_data_free_message(tmp_path, build, kwargs, fragment, name):
    path = build(tmp_path)
    with pytest.raises(LocalDataError) as info:
        load_local_table(str(path), **kwargs)
    msg = str(info.value)
    assert fragment in msg
    assert (name or path.name) not in msg, msg
    assert str(tmp_path) not in msg and "/dev/" not in msg, msg
    assert (name or path.name) in info.value.detail, info.value.detail
    for leak in LEAKS:
        assert leak not in msg, f"{leak!r} leaked into: {msg}"
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, LocalDataError)


# ------------------------------------------------------------------ accepted data

def test_16_bit_png_is_scaled_by_its_real_range(tmp_path):
    from PIL import Image

    values = (np.arange(16, dtype=np.uint16) * 4000 + 5).reshape(4, 4)   # 5 .. 60005
    _png(tmp_path / "imgs" / "a.png", values)
    assert Image.open(tmp_path / "imgs" / "a.png").mode.startswith("I")
    x, y = load_local_table(str(tmp_path / "imgs"))
    assert y is None and x.shape == (1, 16)
    assert 0.0 <= x.min() and x.max() <= 1.0 and np.unique(x).size == 16
    np.testing.assert_allclose(x[0], values.ravel() / 65535.0)


def test_mode_i_image_in_range_and_8_bit_images_side_by_side(tmp_path):
    _mode_i_tiff(tmp_path / "imgs" / "a" / "i.tif", 65535)
    _png(tmp_path / "imgs" / "b" / "l.png", np.full((3, 3), 255, np.uint8))
    x, _ = load_local_table(str(tmp_path / "imgs"))
    assert x.tolist() == [[1.0] * 9, [1.0] * 9]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "LA", "1"])
def test_colour_palette_and_bilevel_images_become_grey(tmp_path, mode):
    from PIL import Image

    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[0, 0] = (255, 255, 255)
    img = Image.fromarray(rgb, "RGB").convert(mode)
    (tmp_path / "imgs").mkdir()
    img.save(tmp_path / "imgs" / "a.png")
    x, _ = load_local_table(str(tmp_path / "imgs"))
    np.testing.assert_allclose(x[0], [1.0, 0.0, 0.0, 0.0], atol=1 / 255)


def test_text_labels_map_identically_on_nodes_with_different_label_sets(tmp_path):
    a = _write(tmp_path / "a.csv", "f,diagnosis\n1,flu\n2,cold\n3,flu\n4,asthma\n")
    b = _write(tmp_path / "b.tsv", "diagnosis\tf\ncovid\t1\ncold\t2\n flu \t3\n")
    _, ya = load_local_table(str(a), label_column="diagnosis", stable_labels=True)
    _, yb = load_local_table(str(b), label_column="diagnosis", stable_labels=True)
    codes_a = dict(zip(["flu", "cold", "flu", "asthma"], ya.tolist()))
    codes_b = dict(zip(["covid", "cold", "flu"], yb.tolist()))
    assert codes_a["flu"] == codes_b["flu"] and codes_a["cold"] == codes_b["cold"]
    assert len(set(codes_a.values()) | set(codes_b.values())) == 4
    assert all(TEXT_CODE_BASE <= c < 2 * TEXT_CODE_BASE for c in ya.tolist() + yb.tolist())
    c = _npz(tmp_path / "c.npz", x=np.ones((2, 1)), y=np.array(["cold", "measles"]))
    assert load_local_table(str(c), stable_labels=True)[1][0] == codes_a["cold"]   # npz = csv


def test_image_class_folders_map_identically_on_nodes(tmp_path):
    for node, classes in (("n1", ("cat", "dog")), ("n2", ("dog", "eel", "7"))):
        for cls in classes:
            _png(tmp_path / node / cls / "0.png", np.zeros((2, 2), np.uint8))
    _, y1 = load_local_table(str(tmp_path / "n1"), stable_labels=True)
    _, y2 = load_local_table(str(tmp_path / "n2"), stable_labels=True)
    assert y1[1] == y2[1]                     # "dog" (sorted: n1 cat, dog; n2 7, dog, eel)
    assert y2[0] == 7                         # numeric class folders keep their numbers


def test_default_labels_stay_small_per_node_indices(tmp_path):
    """Until the evaluation path compacts stable codes, the default is the former mapping."""
    a = _write(tmp_path / "a.csv", "f,l\n1,flu\n2,cold\n3,flu\n")
    assert load_local_table(str(a), label_column="l")[1].tolist() == [1, 0, 1]
    _png(tmp_path / "imgs" / "dog" / "0.png", np.zeros((2, 2), np.uint8))
    _png(tmp_path / "imgs" / "eel" / "0.png", np.zeros((2, 2), np.uint8))
    assert load_local_table(str(tmp_path / "imgs"))[1].tolist() == [0, 1]
    n = _npz(tmp_path / "n.npz", x=np.ones((2, 1)), y=np.array([4, 2]))
    assert load_local_table(str(n))[1].tolist() == [4, 2]
    assert load_local_table(str(n), stable_labels=True)[1].tolist() == [4, 2]


def test_label_codes_rules():
    assert label_codes(np.array([3, 0, 2])).tolist() == [3, 0, 2]
    assert label_codes(np.array(["3", " 0", "2.0"])).tolist() == [3, 0, 2]
    assert label_codes(np.array([True, False])).tolist() == [1, 0]
    neg = label_codes(np.array([-1, 5]))
    assert neg[1] == 5 and neg[0] >= TEXT_CODE_BASE
    assert label_codes(np.array(["-1", "-1.0"])).tolist() == [neg[0]] * 2
    assert label_codes(np.array([2.5]))[0] == label_codes(np.array(["2.50"]))[0]
    assert label_codes(np.array([b"cat"]))[0] == label_codes(np.array(["cat"]))[0]
    assert labels_to_int(np.array(["cat", "dog"])).tolist() == \
        label_codes(np.array(["cat", "dog"])).tolist()
    assert label_codes(np.array([], dtype=str)).size == 0
    with pytest.raises(LocalDataError, match="not a finite number"):
        label_codes(np.array([1.0, np.inf]))
    with pytest.raises(LocalDataError, match="mix"):
        label_codes(np.array([SECRET, 1], dtype=object))


def test_compact_codes_gives_small_shared_row_indices():
    y1, y2 = label_codes(np.array(["flu", "cold"])), label_codes(np.array(["covid", "flu", "3"]))
    vocab = np.unique(np.concatenate([np.unique(y1), np.unique(y2)]))
    r1, r2 = compact_codes(y1, vocab), compact_codes(y2, vocab)
    assert r1[0] == r2[1] and max(r1.max(), r2.max()) == len(vocab) - 1 == 3
    with pytest.raises(ValueError, match="missing from the vocabulary"):
        compact_codes(label_codes(np.array(["measles"])), vocab)


def test_valid_edge_values_are_accepted(tmp_path):
    bom = _write(tmp_path / "bom.csv", "\ufefff1,f2\n1,-1e150\n")       # BOM + header
    x, _ = load_local_table(str(bom))
    assert x.tolist() == [[1.0, -MAX_ABS]]
    real = _npz(tmp_path / "real.npz", x=np.arange(6, dtype=np.int16).reshape(3, 2),
                y=np.array([0, 1, 1], np.uint8))
    link = _link(tmp_path / "link.npz", real)                            # a link to a file: ok
    x, y = load_local_table(str(link))
    assert x.dtype == np.float64 and x.shape == (3, 2) and y.tolist() == [0, 1, 1]
