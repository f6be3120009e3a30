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
