import numpy as np
import pytest

from fedclust import fcm


def naive_local_sums(x, v, m):
    """Paper 004 Algorithm 2, literally (per-point loops) — the reference for the vectorised one."""
    c, f = v.shape
    ws, u = np.zeros((c, f)), np.zeros(c)
    for xj in x:
        numer = np.array([max(np.sum((xj - vc) ** 2), 1e-300) ** (1 / (m - 1)) for vc in v])
        denom = np.sum(1 / numer)
        for k in range(c):
            mu = 1 / (numer[k] * denom)
            ws[k] += mu**m * xj
            u[k] += mu**m
    return u, ws


@pytest.mark.parametrize("m", [2.0, 1.5, 3.0])
def test_local_sums_match_the_papers_loop(m):
    rng = np.random.default_rng(0)
    x, v = rng.normal(size=(300, 3)), rng.normal(size=(4, 3))
    u, ws = fcm.local_sums(x, v, m, chunk_size=64)      # several chunks
    u_ref, ws_ref = naive_local_sums(x, v, m)
    np.testing.assert_allclose(u, u_ref, rtol=1e-10)
    np.testing.assert_allclose(ws, ws_ref, rtol=1e-10)


def test_memberships_are_a_partition_of_unity_and_favour_the_nearest_center():
    rng = np.random.default_rng(1)
    x, v = rng.normal(size=(500, 5)), rng.normal(size=(6, 5))
    u = fcm.memberships(x, v, 2.0)
    np.testing.assert_allclose(u.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(u >= 0)
    assert np.array_equal(u.argmax(1), fcm.squared_distances(x, v).argmin(1))


def test_point_on_a_center_gets_membership_one_not_nan():
    v = np.array([[0.0, 0.0], [3.0, 0.0]])
    u = fcm.memberships(np.array([[0.0, 0.0]]), v)
    assert np.isfinite(u).all() and u[0, 0] > 0.999999


def test_center_update_is_weighted_mean_and_empty_cluster_keeps_its_center():
    prev = np.array([[1.0, 1.0], [5.0, 5.0]])
    new = fcm.update_centers(np.array([2.0, 0.0]), np.array([[4.0, 6.0], [0.0, 0.0]]), prev)
    np.testing.assert_allclose(new, [[2.0, 3.0], [5.0, 5.0]])


def test_estimator_api_and_reproducibility():
    from sklearn.datasets import make_blobs

    x, y = make_blobs(600, centers=3, cluster_std=0.5, random_state=0)
    a = fcm.FuzzyCMeans(3, init="k-means++", random_state=4, max_iter=100, tol=1e-6).fit(x)
    b = fcm.FuzzyCMeans(3, init="k-means++", random_state=4, max_iter=100, tol=1e-6).fit(x)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    proba = a.predict_proba(x)
    assert proba.shape == (600, 3)
    assert np.array_equal(a.predict(x), proba.argmax(1))
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(y, a.predict(x)) > 0.95
    assert a.converged_ and a.shifts_[-1] < 1e-6


def test_fcm_objective_does_not_increase():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 2))
    v = x[:4].copy()
    last = np.inf
    for _ in range(15):
        j = fcm.objective(x, v)
        assert j <= last + 1e-9
        last = j
        v = fcm.update_centers(*fcm.local_sums(x, v), v)


@pytest.mark.parametrize("kwargs, message", [
    ({"m": 1.0}, "m must be > 1"),
    ({"n_clusters": 0}, "n_clusters"),
    ({"init": "bogus"}, "'init' parameter of FuzzyCMeans must be a str among"),
])
def test_estimator_rejects_bad_parameters(kwargs, message):
    x = np.random.default_rng(0).normal(size=(20, 2))
    params = {"n_clusters": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        fcm.FuzzyCMeans(**params).fit(x)


def test_nan_input_is_rejected_with_a_fix():
    with pytest.raises(ValueError, match="NaN"):
        fcm.local_sums(np.array([[np.nan, 1.0]]), np.zeros((2, 2)))


def test_local_sums_do_not_depend_on_threads_or_block_size():
    rng = np.random.default_rng(7)
    x, v = rng.normal(size=(20_000, 6)), rng.normal(size=(5, 6))
    one = fcm.local_sums(x, v, chunk_size=1024, n_threads=1)
    two = fcm.local_sums(x, v, chunk_size=1024, n_threads=2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])   # bitwise
    big = fcm.local_sums(x, v, chunk_size=50_000)
    np.testing.assert_allclose(big[1], one[1], rtol=1e-12)


def test_estimator_follows_the_scikit_learn_protocol():
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError

    est = fcm.FuzzyCMeans(4, m=1.7, tol=1e-4, init="k-means++", random_state=3)
    twin = clone(est)
    assert twin is not est and twin.get_params() == est.get_params()
    assert twin.set_params(n_clusters=2).n_clusters == 2 and est.n_clusters == 4
    with pytest.raises(ValueError, match="Invalid parameter 'clusters'"):
        est.set_params(clusters=2)
    x = np.random.default_rng(1).normal(size=(50, 2))
    with pytest.raises(NotFittedError, match="fit"):
        est.predict(x)
    with pytest.raises(NotFittedError):
        est.predict_proba(x)
    labels = est.fit_predict(x)
    assert labels.shape == (50,) and set(labels) <= set(range(4))


def one_shot(x, v, m):
    """The former implementation: the (n, C) expansion ‖x‖² − 2x·v + ‖v‖², clamped, then
    memberships and μ^m with two powers."""
    d2 = np.einsum("ij,ij->i", x, x)[:, None] - 2.0 * (x @ v.T) + np.einsum("ij,ij->i", v, v)
    d2 = np.maximum(d2, np.finfo(np.float64).tiny ** 0.5)
    w = (d2 / d2.min(1, keepdims=True)) ** (-1.0 / (m - 1.0))
    u = w / w.sum(1, keepdims=True)
    return u, (u**m).sum(0), (u**m).T @ x, float(np.sum(u**m * d2))


@pytest.mark.parametrize("m", [2.0, 1.5, 3.0])
def test_the_fused_pass_equals_the_former_formulas_to_1e_12(m):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(30_000, 7)) * 4 + 2
    v = rng.normal(size=(9, 7)) * 4 + 2                      # centers off the samples
    u_ref, big_u_ref, ws_ref, j_ref = one_shot(x, v, m)
    big_u, ws = fcm.local_sums(x, v, m)
    np.testing.assert_allclose(big_u, big_u_ref, rtol=1e-12)
    np.testing.assert_allclose(ws, ws_ref, rtol=1e-12, atol=1e-12 * np.abs(ws_ref).max())
    np.testing.assert_allclose(fcm.memberships(x, v, m), u_ref, rtol=1e-12, atol=1e-15)
    assert fcm.objective(x, v, m) == pytest.approx(j_ref, rel=1e-12)


@pytest.mark.parametrize("m", [2.0, 2.7])
def test_a_center_on_a_sample_is_computed_without_cancellation(m):
    # k-means++ puts centers on samples: there the expansion ‖x‖² − 2x·v + ‖v‖² is pure
    # roundoff (the former code's memberships were off by 1e-8 at m = 2.7); the pass must match
    # the direct ‖x − v‖² formula.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5_000, 16)) * 3 + 5
    v = x[rng.choice(5_000, 10, replace=False)].copy()
    d2 = np.maximum(((x[:, None, :] - v[None]) ** 2).sum(-1), np.finfo(np.float64).tiny ** 0.5)
    w = (d2 / d2.min(1, keepdims=True)) ** (-1.0 / (m - 1.0))
    u = w / w.sum(1, keepdims=True)
    np.testing.assert_allclose(fcm.memberships(x, v, m), u, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fcm.local_sums(x, v, m)[0], (u**m).sum(0), rtol=1e-12)


def test_memberships_and_sums_of_one_pass_equal_separate_calls():
    from fedclust.fcm.kernel import augment, fcm_pass

    rng = np.random.default_rng(5)
    x, v = rng.normal(size=(20_000, 5)), rng.normal(size=(4, 5))
    both = fcm_pass(augment(x), v, 1.8, augmented=True, memberships=True, block=777)
    np.testing.assert_allclose(both.memberships, fcm.memberships(x, v, 1.8), rtol=1e-13)
    u, ws = fcm.local_sums(x, v, 1.8)
    np.testing.assert_allclose(both.u, u, rtol=1e-13)
    np.testing.assert_allclose(both.ws, ws, rtol=1e-12, atol=1e-12)
    assert both.objective == pytest.approx(fcm.objective(x, v, 1.8), rel=1e-13)


def test_the_pass_allocates_no_n_by_c_array():
    import tracemalloc

    rng = np.random.default_rng(0)
    x, v = rng.normal(size=(200_000, 8)), rng.normal(size=(10, 8))
    fcm.local_sums(x, v)                      # warm up (thread pool, BLAS controller)
    tracemalloc.start()
    fcm.local_sums(x, v, 1.5)
    fcm.objective(x, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200_000 * 10 * 8 / 2, f"peak {peak / 1e6:.1f} MB: an (N, C) temporary"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("call", ["local_sums", "memberships", "objective"])
def test_non_finite_rows_are_rejected_by_every_entry_point(bad, call):
    x = np.ones((50, 2))
    x[17, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        getattr(fcm, call)(x, np.array([[0.0, 0.0], [2.0, 2.0]]))


@pytest.mark.parametrize("m", [2.0, 1.5])
def test_samples_on_a_center_at_the_origin_get_finite_memberships(m):
    """Probe: identical rows (all scaled to 0) and centers at the origin gave NaN sums: the
    near-center recomputation was skipped when every squared norm was 0."""
    from fedclust import fcm

    x = np.zeros((20, 3))
    u, ws = fcm.local_sums(x, np.zeros((3, 3)), m)
    assert np.isfinite(u).all() and np.isfinite(ws).all()
    assert u.sum() == pytest.approx(20 * 3 ** (1 - m))     # each row: 1/3 to each center
