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
    int8 = fmt in ("int8", wire.DELTA)
    for k, v in m.items():
        assert back[k].dtype == np.float32 and back[k].shape == v.shape
        # int8: within half a step of the column's scale; float16: 11-bit mantissa
        step = np.abs(v).max(axis=1, keepdims=True) / 127 if (int8 and k[0] == "W") \
            else np.abs(v) * 2.0 ** -10 + 1e-7
        assert np.all(np.abs(back[k] - v) <= (step * 0.5001 if int8 else step) + 1e-7)
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
    assert set(fw.keyed_models(array_record(**named))[0]) == {"1:0:2"}
    keyed, unreadable = fw.keyed_models(fw.keyed_record({"1:0:2": fw.encoded_arrays(m, "int8"),
                                                         "3:1:1": fw.encoded_arrays(m, "int8")}))
    assert set(keyed) == {"1:0:2", "3:1:1"} and unreadable == []
    np.testing.assert_array_equal(keyed["3:1:1"]["W0"], wire.roundtrip(m, "int8")["W0"])
    assert fw.keyed_record({}) is None
    # int8-delta: against the bases the receiver builds; a base it cannot build is named
    init = ae.to_numpy(ae.init_params(3, ae.layer_sizes(784, [100, 64, 32]), 4))
    ids = fw.init_ids(4, 3)
    enc = wire.encode(m, wire.DELTA, init, ids)
    resolve = lambda ids_, sizes: wire.resolve(ids_, sizes, "keras")  # noqa: E731
    keyed, unreadable = fw.keyed_models(fw.keyed_record({
        "1:0:2": fw.flower_arrays(wire.rows(enc, [1])),
        "3:1:1": fw.flower_arrays(dict(wire.rows(enc, [2]), digest=np.array([5])))}), resolve)
    assert set(keyed) == {"1:0:2"} and unreadable == ["3:1:1"]
    np.testing.assert_array_equal(keyed["1:0:2"]["W3"], wire.roundtrip(m, "int8")["W3"][1:2])
    got = fw.read_models(fw.local_reply(m, np.array([0, 1, 2]), None, wire.DELTA, {"k": 3},
                                        init, ids), resolve=resolve)
    np.testing.assert_array_equal(got["W0"], wire.roundtrip(m, "int8")["W0"])
    held = fw.expected_resolver(fw.held_ids([4, 2, 0]), init)
    models, counts = fw.read_comm(fw.comm_reply(m, np.array([1, 2, 3]), wire.DELTA, 0.0, init,
                                                fw.held_ids([4, 2, 0])), held)
    np.testing.assert_array_equal(models["b1"], wire.roundtrip(m, "int8")["b1"])
    with pytest.raises(wire.BaseMismatch, match="expected"):
        fw.read_comm(fw.comm_reply(m, np.array([1, 2, 3]), wire.DELTA, 0.0, init,
                                   fw.held_ids([4, 2, 1])), held)


# -- int8-delta ---------------------------------------------------------------------------------

SIZES = ae.layer_sizes(784, [100, 64, 32])


def _trained(start: dict[str, np.ndarray], epochs: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``start`` trained ``epochs`` epochs on 64 random sparse 'images' per model."""
    rng = np.random.default_rng(seed)
    m = start["W0"].shape[0]
    data = [(rng.random((64, 784)) < 0.2).astype(np.float32) * rng.random((64, 784),
                                                                         dtype=np.float32)
            for _ in range(m)]
    out, _ = ae.train(ae.TrainCall(ae.from_numpy(start), data, epochs, 32, 1e-3, 0, seed))
    return ae.to_numpy(out)


def _nbytes(enc: dict[str, np.ndarray]) -> int:
    return sum(v.nbytes for v in enc.values())


def test_int8_delta_delivers_the_int8_weights_whatever_the_base() -> None:
    init = _models(3)
    m = _trained(init, 3)
    want = wire.roundtrip(m, "int8")
    held = wire.roundtrip(_trained(init, 2, seed=1), "int8")
    cases = [(None, None), (init, fw_init_ids(5, 3)),
             (held, np.array([[wire.HELD, 0, 0, g] for g in (4, 7, 9)])),
             ({k: v * 50 for k, v in init.items()}, np.array([[wire.HELD, 0, 0, 1]] * 3))]
    for base, ids in cases:
        back = wire.decode(wire.encode(m, wire.DELTA, base, ids), base)
        for k, v in want.items():
            np.testing.assert_array_equal(back[k], v)


def _bits(named: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v, dtype=np.float32).view(np.uint32) for k, v in named.items()}


def test_int8_delta_decodes_to_the_int8_record_bit_for_bit_with_every_fallback() -> None:
    """decode(encode(x, int8-delta)) == decode(encode(x, int8)), compared as float32 bits
    (signed zeros included), on the paths the codec falls back to: no base (a node that
    cannot rebuild the initialisation, a re-send), columns of zeros (scale 1), a base so far
    off that its codes clip and the differences need four bytes and no predictor, bases of
    several kinds in one record, and biases beyond half precision's range."""
    init = _models(3)
    m = _trained(init, 2)
    m["W1"][:, :, 5] = 0.0                          # a dead unit: scale falls back to 1
    m["W2"][1] = -0.0                               # a whole model's matrix of signed zeros
    m["b0"][0, 0, :3] = (1e6, -1e6, -0.0)           # half precision: inf, -inf, -0
    far = {k: v * 1e7 for k, v in init.items()}     # base codes beyond the clip, |d| >= 2^20
    mixed = np.array([[wire.INIT, 5, 3, 0], [wire.NONE, 0, 0, 0], [wire.HELD, 0, 0, 2]])
    cases = [(None, None), (init, fw_init_ids(5, 3)), (far, fw_init_ids(5, 3)),
             (init, mixed), (far, np.array([[wire.HELD, 0, 0, g] for g in range(3)]))]
    want = _bits(wire.decode(wire.encode(m, "int8")))
    for base, ids in cases:
        enc = wire.encode(m, wire.DELTA, base, ids)
        got = _bits(wire.decode(enc, base))
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k}, base ids {ids}")
    # the roundtrip a simulation applies instead of a message, numpy and torch alike
    for k, v in _bits(wire.roundtrip(m, wire.DELTA)).items():
        np.testing.assert_array_equal(v, want[k])
    torch_back = ae.to_numpy(wire.roundtrip_params(ae.from_numpy(m), wire.DELTA))
    for k, v in _bits(torch_back).items():
        np.testing.assert_array_equal(v, want[k])


def fw_init_ids(seed: int, count: int) -> np.ndarray:
    return np.array([[wire.INIT, seed, count, j] for j in range(count)])


def test_int8_delta_sends_the_difference_from_the_base_in_fewer_bytes() -> None:
    init = ae.to_numpy(ae.init_params(2, SIZES, 5))
    fresh = _trained(init, 5)
    int8 = _nbytes(wire.encode(fresh, "int8"))
    # a fresh model against its seeded initialisation: well under int8's bytes
    assert _nbytes(wire.encode(fresh, wire.DELTA, init, fw_init_ids(5, 2))) < 0.75 * int8
    # without a base: int8, compressed (uniform initial weights hardly compress)
    assert _nbytes(wire.encode(fresh, wire.DELTA)) > 0.9 * int8
    # one more round from the copy the receiver holds: a small fraction
    held = wire.roundtrip(fresh, "int8")
    again = _trained(held, 1, seed=2)
    ids = np.array([[wire.HELD, 0, 0, 0], [wire.HELD, 0, 0, 1]])
    assert _nbytes(wire.encode(again, wire.DELTA, held, ids)) < 0.5 * int8


def test_int8_delta_refuses_a_base_other_than_the_senders() -> None:
    init = _models(3)
    m = _trained(init, 1)
    enc = wire.encode(m, wire.DELTA, init, fw_init_ids(3, 3))
    wrong = {k: v.copy() for k, v in init.items()}
    wrong["W5"][1, 0, 0] += 1e-6
    with pytest.raises(wire.BaseMismatch, match="differs"):
        wire.decode(enc, wrong)
    with pytest.raises(wire.BaseMismatch):
        wire.decode(enc)                       # names a base, none given
    with pytest.raises(ValueError, match="need that base"):
        wire.encode(m, wire.DELTA, None, fw_init_ids(3, 3))


def test_resolve_builds_the_named_bases() -> None:
    ids = np.array([[wire.INIT, 9, 3, 2], [wire.NONE, 0, 0, 0], [wire.HELD, 0, 0, 4]])
    kept = {k: v[:1] + 1.0 for k, v in _models(1).items()}
    base = wire.resolve(ids, SIZES, "keras", {4: kept}.__getitem__)
    init = ae.to_numpy(ae.init_params(3, SIZES, 9))
    for k in init:
        np.testing.assert_array_equal(base[k][0], init[k][2])
        assert not base[k][1].any()
        np.testing.assert_array_equal(base[k][2], kept[k][0])
    with pytest.raises(wire.BaseMismatch):
        wire.resolve(ids, SIZES, "keras")            # a held copy, but none kept
    with pytest.raises(wire.BaseMismatch):
        wire.resolve(np.array([[wire.INIT, 9, 3, 3]]), SIZES, "keras")
    assert wire.init_check([100, 64, 32], "keras") == wire.init_check([100, 64, 32], "keras")
    assert wire.init_check([100, 64, 32], "keras") != wire.init_check([100, 64, 32], "torch")


def test_int8_delta_records_split_and_join_by_model() -> None:
    init = _models(3)
    m = _trained(init, 1)
    enc = wire.encode(m, wire.DELTA, init, fw_init_ids(3, 3))
    part = wire.join([wire.rows(enc, [2]), wire.rows(enc, [0])])
    back = wire.decode(part, {k: v[[2, 0]] for k, v in init.items()})
    want = wire.roundtrip(m, "int8")
    for k, v in want.items():
        np.testing.assert_array_equal(back[k], v[[2, 0]])


def test_a_damaged_int8_delta_record_is_named() -> None:
    import zlib

    m = _trained(_models(2), 1)
    enc = wire.encode(m, wire.DELTA)
    assert wire.problem(enc) is None
    assert "expected" in wire.problem({k: v for k, v in enc.items() if k != "digest"})
    assert "lengths" in wire.problem(dict(enc, zn=enc["zn"] + 1))
    assert "descriptors" in wire.problem(dict(enc, base=enc["base"] + 7))
    assert "layer widths" in wire.problem(dict(enc, sizes=np.array([784])))
    # bytes that do not inflate, inflate to more than a model, or to codes beyond int8
    bad = dict(enc, z=enc["z"][::-1].copy())
    with pytest.raises(ValueError, match="inflate|bytes"):
        wire.decode(bad)
    with pytest.raises(ValueError, match="compressor"):
        wire.decode(dict(enc, z=np.where(np.arange(len(enc["z"])) == 0, 7, enc["z"]).astype(
            np.uint8)))

    def stream(raw: bytes) -> np.ndarray:
        return np.frombuffer(bytes([wire.DEFLATE]) + zlib.compress(raw), dtype=np.uint8)

    header = b"\x01" + bytes(len(SIZES) - 1)       # one byte per value, no predictor
    n_w = sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:], strict=False))
    one = wire.rows(enc, [0])
    bomb = stream(header + bytes(10 * n_w))
    with pytest.raises(ValueError, match="end where|bytes"):
        wire.decode(dict(one, z=bomb, zn=np.array([len(bomb)])))
    big = stream(header + bytes(4 * sum(SIZES[1:])) + bytes([255]) * n_w
                 + bytes(2 * sum(SIZES[1:])))
    with pytest.raises(ValueError, match="int8 range"):
        wire.decode(dict(one, z=big, zn=np.array([len(big)])))
    n_b = sum(SIZES[1:])
    odd = stream(b"\x01\x09" + bytes(len(SIZES) - 2) + bytes(4 * n_b + n_w + 2 * n_b))
    with pytest.raises(ValueError, match="header"):
        wire.decode(dict(one, z=odd, zn=np.array([len(odd)])))
    # scales travel as their bits XOR the base's (here none: 1.0); these decode to -1.0
    negative = stream(header + bytes(3 * n_b) + b"\x80" * n_b + bytes(n_w + 2 * n_b))
    with pytest.raises(ValueError, match="finite and positive"):
        wire.decode(dict(one, z=negative, zn=np.array([len(negative)])))


def test_each_predictor_gives_the_differences_back() -> None:
    rng = np.random.default_rng(0)
    profile = rng.integers(-20, 20, 50)
    shared = np.tile(profile, (40, 1)) + rng.integers(-1, 2, (40, 50))
    shared[::3] = 0                                  # rows that never moved
    smooth_rows = np.cumsum(rng.integers(-1, 2, (40, 50)), axis=0) * 3
    smooth_cols = np.cumsum(rng.integers(-1, 2, (40, 50)), axis=1) * 3
    noise = rng.integers(-60, 60, (40, 50))
    for d, want in ((shared, wire.COLUMN_MEDIAN), (smooth_rows, wire.ROW_ABOVE),
                    (smooth_cols, wire.COLUMN_LEFT), (noise, None)):
        d = d.astype(np.int32)
        pid, res, mask, med = wire._predict(d)
        assert want is None or pid == want
        live = (np.unpackbits(np.frombuffer(mask, np.uint8), count=len(d)).astype(bool)
                if mask else None)
        np.testing.assert_array_equal(wire._unpredict(pid, res, live, med), d)


def test_a_decoded_record_is_reused_only_where_its_base_needs_no_check() -> None:
    init = _models(2)
    m = _trained(init, 1, seed=3)
    fresh = wire.encode(m, wire.DELTA, init, fw_init_ids(11, 3))
    assert wire.cached(fresh) is None                 # not decoded in this process yet
    first = wire.decode(fresh, init)
    again = wire.cached(fresh)
    assert again is not None and again is not first
    for k in first:
        np.testing.assert_array_equal(again[k], first[k])
    # a kept copy differs from receiver to receiver: always checked against its digest
    held = wire.encode(m, wire.DELTA, init, np.array([[wire.HELD, 0, 0, 1]] * 3))
    wire.decode(held, init)
    assert wire.cached(held) is None
