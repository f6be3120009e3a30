"""How FedCRef's models travel (fedclust.fedcref.wire): the formats round as documented, a
damaged record is named, and the bytes shrink as promised."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref import wire


def _models(seed: int = 0) -> dict[str, np.ndarray]:
    return ae.to_numpy(ae.init_params(3, ae.layer_sizes(784, [100, 64, 32]), seed))


@pytest.mark.parametrize("fmt", wire.FORMATS)
def test_roundtrip_is_close_and_idempotent(fmt: str) -> None:
    m = _models()
    back = wire.roundtrip(m, fmt)
    assert set(back) == set(m)
    for k, v in m.items():
        assert back[k].dtype == np.float32 and back[k].shape == v.shape
        # int8: within half a step of the column's scale; float16: 11-bit mantissa
        step = np.abs(v).max(axis=1, keepdims=True) / 127 if (fmt == "int8" and k[0] == "W") \
            else np.abs(v) * 2.0 ** -10 + 1e-7
        assert np.all(np.abs(back[k] - v) <= (step * 0.5001 if fmt == "int8" else step) + 1e-7)
        np.testing.assert_array_equal(wire.roundtrip(back, fmt)[k], back[k])


def test_int8_is_about_a_quarter_of_the_bytes() -> None:
    m = _models()
    full = sum(v.nbytes for v in wire.encode(m, "float32").values())
    small = sum(v.nbytes for v in wire.encode(m, "int8").values())
    assert 0.25 < small / full < 0.27


def test_a_damaged_record_is_named() -> None:
    enc = wire.encode(_models(), "int8")
    assert wire.problem(enc) is None
    assert "without its scales" in wire.problem({k: v for k, v in enc.items() if k != "W0.s"})
    bad = dict(enc, **{"W1.s": -enc["W1.s"]})
    assert "finite and positive" in wire.problem(bad)
    bad = dict(enc, **{"W2.q": enc["W2.q"].astype(np.int16)})
    assert "expected int8" in wire.problem(bad)
    bad = dict(enc, **{"b0": enc["b0"].astype(np.int32)})
    assert "floating-point" in wire.problem(bad)


def test_each_message_reads_back_what_its_builder_wrote() -> None:
    """strategies.wire.fedcref holds both ends of every FedCRef message."""
    from strategies.wire import fedcref as fw
    from strategies.wire.records import array_record

    ids, members = fw.read_members(fw.members_config([4, 1], [[0, 2], [1]]))
    assert ids == [4, 1] and [m.tolist() for m in members] == [[0, 2], [1]]
    assert fw.read_members({}) == ([], [])
    m = _models()
    back = fw.read_models(fw.local_reply(m, np.array([0, 1, 2]), None, "int8", {"k": 3}))
    for k, v in wire.roundtrip(m, "int8").items():
        np.testing.assert_array_equal(back[k], v)
    rd = fw.local_reply(None, None, np.ones((3, 2), np.int64), "int8", {"k": 3})
    assert fw.read_models(rd) is None and fw.read_hist(rd).shape == (3, 2)
    acc = np.array([[True, False], [False, True]])
    np.testing.assert_array_equal(fw.read_accept(fw.accept_reply(acc, 0.1)), acc)
    assert fw.missing_reply([3], 0.0).metric_records["metrics"]["missing"] == [3]
    models, counts = fw.read_comm(fw.comm_reply(m, np.array([5.0, 6.0, 7.0]), "float32", 0.0))
    np.testing.assert_array_equal(models["W0"], m["W0"])
    assert counts.tolist() == [5.0, 6.0, 7.0]
    assert fw.read_refine(fw.refine_reply(0.5, 0.25, np.array([True, False]), None, 0.0)) \
        == (0.5, [True, False], 0.25)
    assert fw.read_refine(fw.refine_reply(1.0, 0.0, None, None, 0.0))[1] is None
    named = {f"1:0:2/{k}": v for k, v in wire.encode(m, "float16").items()}
    assert set(fw.keyed_models(array_record(**named))) == {"1:0:2"}
    keyed = fw.keyed_models(fw.keyed_record({"1:0:2": fw.encoded_arrays(m, "int8"),
                                             "3:1:1": fw.encoded_arrays(m, "int8")}))
    assert set(keyed) == {"1:0:2", "3:1:1"}
    np.testing.assert_array_equal(keyed["3:1:1"]["W0"], wire.roundtrip(m, "int8")["W0"])
    assert fw.keyed_record({}) is None
