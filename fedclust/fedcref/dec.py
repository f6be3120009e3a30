"""Deep Embedded Clustering (Xie, Girshick & Farhadi 2016), used by paper 000 as the realistic
initial local clustering and as the centralized baseline (Table 2).

Steps: (1) autoencoder d-500-500-2000-10 (ReLU, linear embedding and output) pretrained on the
reconstruction loss; (2) k-means (``n_init=20``) on the embedding gives the initial centroids
μ_j; (3) KL refinement: soft assignment q_ij ∝ (1 + ‖z_i − μ_j‖²)^−1 (Student t, one degree of
freedom), target p_ij ∝ q_ij² / f_j with f_j = Σ_i q_ij, minimise KL(P‖Q) over encoder and
centroids; the target is recomputed every ``update_interval`` iterations and training stops when
fewer than ``tol`` of the labels changed between two target updates (the reference code had this
test inverted; here it is the DEC paper's).

Deviation from DEC's layer-wise denoising pretraining: the autoencoder is pretrained end to end
with Adam (as in widely used DEC re-implementations); epochs are configurable.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, ClusterMixin, _fit_context
from sklearn.cluster import KMeans
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted, validate_data


def _mlp(sizes: Sequence[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DEC(ClusterMixin, BaseEstimator):
    """Deep Embedded Clustering as a scikit-learn estimator.

    :meth:`fit` runs the three steps from scratch (so two fits on the same data agree); after
    an explicit :meth:`pretrain`, the next :meth:`fit` on data with the same features starts
    from that autoencoder instead, which lets a caller inspect the embedding (e.g. to choose K)
    before clustering it.

    Parameters
    ----------
    n_clusters : int, default=10
        Number of clusters.
    hidden : sequence of int, default=(500, 500, 2000, 10)
        Encoder layer sizes; the last is the embedding dimension.
    pretrain_epochs : int, default=50
        Autoencoder epochs (Adam, lr 1e-3).
    batch_size : int, default=256
        Mini-batch size of both stages (DEC: 256).
    maxiter : int, default=2000
        KL-refinement iterations (mini-batches).
    update_interval : int, default=140
        Iterations between target-distribution updates.
    tol : float, default=0.001
        Stop when the share of labels changed between two target updates falls below it.
    lr : float, default=0.01
        SGD learning rate of the KL stage (momentum 0.9).
    random_state : int, default=0
        Seed of the weights, the mini-batch order and the k-means initialisation.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, hidden[-1])
        Centroids μ_j in the embedding space.
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training sample.
    n_iter_ : int
        KL-refinement iterations run.
    encoder_, decoder_ : torch.nn.Sequential
        The trained autoencoder.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during :meth:`fit`, when ``X`` has string column names.
    """

    _parameter_constraints: dict = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "hidden": [tuple, list],
        "pretrain_epochs": [Interval(Integral, 0, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "maxiter": [Interval(Integral, 0, None, closed="left")],
        "update_interval": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "random_state": [Interval(Integral, 0, 2**32 - 1, closed="both")],
    }

    def __init__(self, n_clusters: int = 10, hidden: Sequence[int] = (500, 500, 2000, 10),
                 pretrain_epochs: int = 50, batch_size: int = 256, maxiter: int = 2000,
                 update_interval: int = 140, tol: float = 0.001, lr: float = 0.01,
                 random_state: int = 0) -> None:
        self.n_clusters = n_clusters
        self.hidden = hidden
        self.pretrain_epochs = pretrain_epochs
        self.batch_size = batch_size
        self.maxiter = maxiter
        self.update_interval = update_interval
        self.tol = tol
        self.lr = lr
        self.random_state = random_state

    def _check_hidden(self) -> None:
        if len(self.hidden) == 0 or not all(isinstance(h, Integral) and h >= 1
                                            for h in self.hidden):
            raise ValueError(f"hidden must be a non-empty sequence of positive ints (encoder "
                             f"layer sizes, e.g. (500, 500, 2000, 10)), got {self.hidden!r}")

    def _check_params_vs_input(self, x: NDArray[np.float32]) -> None:
        self._check_hidden()
        if x.shape[0] < self.n_clusters:
            raise ValueError(f"n_samples={x.shape[0]} should be >= n_clusters="
                             f"{self.n_clusters}: pass more samples or lower n_clusters")

    def _build(self, d: int) -> None:
        torch.manual_seed(self.random_state)
        sizes = [d, *self.hidden]
        self.encoder_ = _mlp(sizes)
        self.decoder_ = _mlp(sizes[::-1])

    @_fit_context(prefer_skip_nested_validation=True)
    def pretrain(self, X: ArrayLike) -> DEC:
        """Step 1: train the autoencoder on reconstruction (MSE); the next :meth:`fit` uses it.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        self : DEC
        """
        x = validate_data(self, X, dtype=np.float32)
        self._check_hidden()
        self._pretrain(x)
        self._pretrained_for_fit = True
        return self

    def _pretrain(self, x: NDArray[np.float32]) -> None:
        xt = torch.as_tensor(x)
        self._build(xt.shape[1])
        params = list(self.encoder_.parameters()) + list(self.decoder_.parameters())
        opt = torch.optim.Adam(params, lr=1e-3)
        gen = torch.Generator().manual_seed(self.random_state)
        for _ in range(self.pretrain_epochs):
            perm = torch.randperm(len(xt), generator=gen)
            for s in range(0, len(xt), self.batch_size):
                xb = xt[perm[s:s + self.batch_size]]
                loss = ((self.decoder_(self.encoder_(xb)) - xb) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

    @torch.no_grad()
    def embed(self, X: ArrayLike) -> NDArray[np.float32]:
        """Embedding z = encoder(X), after :meth:`pretrain` or :meth:`fit`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        z : ndarray of shape (n_samples, hidden[-1])
        """
        check_is_fitted(self, "encoder_")
        x = validate_data(self, X, dtype=np.float32, reset=False)
        return self.encoder_(torch.as_tensor(x)).numpy()

    @staticmethod
    def _soft(z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        q = 1.0 / (1.0 + torch.cdist(z, mu) ** 2)
        return q / q.sum(1, keepdim=True)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: object = None) -> DEC:
        """Steps 1–3: pretrain (unless :meth:`pretrain` was just called), k-means on the
        embedding, KL refinement.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training samples (converted to float32).
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : DEC
            Fitted estimator.
        """
        reuse = getattr(self, "_pretrained_for_fit", False)
        x = validate_data(self, X, dtype=np.float32, reset=not reuse)
        self._check_params_vs_input(x)
        if not reuse:
            self._pretrain(x)
        self._pretrained_for_fit = False
        self._refine(x)
        return self

    def _refine(self, x: NDArray[np.float32]) -> None:
        """Steps 2–3 from the current encoder."""
        xt = torch.as_tensor(x)
        with torch.no_grad():
            z = self.encoder_(xt).numpy()
        km = KMeans(self.n_clusters, n_init=20, random_state=self.random_state).fit(z)
        mu = torch.nn.Parameter(torch.as_tensor(km.cluster_centers_, dtype=torch.float32))
        opt = torch.optim.SGD(list(self.encoder_.parameters()) + [mu], lr=self.lr, momentum=0.9)
        labels = km.labels_.astype(np.int64)
        p = None
        rng = np.random.default_rng(self.random_state)
        perm = rng.permutation(len(xt))
        pos = 0
        self.n_iter_ = 0
        for it in range(int(self.maxiter)):
            if it % self.update_interval == 0:
                with torch.no_grad():
                    q = self._soft(self.encoder_(xt), mu)
                    w = q ** 2 / q.sum(0)
                    p = w / w.sum(1, keepdim=True)
                    new = q.argmax(1).numpy()
                changed = float(np.mean(new != labels))
                labels = new
                if it > 0 and changed < self.tol:
                    break
            if pos >= len(xt):
                perm, pos = rng.permutation(len(xt)), 0
            idx = torch.as_tensor(perm[pos:pos + self.batch_size])
            pos += self.batch_size
            q = self._soft(self.encoder_(xt[idx]), mu)
            loss = torch.nn.functional.kl_div(q.log(), p[idx], reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
            self.n_iter_ = it + 1
        self.cluster_centers_ = mu.detach().numpy()
        with torch.no_grad():
            self.labels_ = self._soft(self.encoder_(xt), mu).argmax(1).numpy().astype(np.int64)

    def predict(self, X: ArrayLike) -> NDArray[np.int64]:
        """Cluster of highest soft assignment q_ij of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        check_is_fitted(self, "cluster_centers_")
        x = validate_data(self, X, dtype=np.float32, reset=False)
        with torch.no_grad():
            z = self.encoder_(torch.as_tensor(x))
            return self._soft(z, torch.as_tensor(self.cluster_centers_)).argmax(1).numpy()


class CentralizedDEC(ClusterMixin, BaseEstimator):
    """Paper 000 Table 2 baseline: DEC on the pooled data, K chosen by the silhouette score of
    the DEC labels on a 2-D t-SNE of the (pretrained) embedding.

    The autoencoder is pretrained once; each candidate K then runs DEC's steps 2–3 from that
    same autoencoder.

    Parameters
    ----------
    k_range : sequence of int, default=(5, ..., 15)
        Candidate K.
    tsne_samples : int, default=5000
        Samples embedded by t-SNE (a random subset, for time).
    dec_options : dict or None, default=None
        Keyword arguments of :class:`DEC` (except ``n_clusters`` and ``random_state``).
    random_state : int, default=0
        Seed of DEC, of the t-SNE subset and of t-SNE.

    Attributes
    ----------
    n_clusters_ : int
        The chosen K.
    labels_ : ndarray of shape (n_samples,)
        DEC labels with the chosen K.
    scores_ : dict of int to float
        t-SNE silhouette of each candidate K (-1 when its labels are a single cluster).
    labels_by_k_ : dict of int to ndarray
        DEC labels of each candidate K.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.
    """

    _parameter_constraints: dict = {
        "k_range": [tuple, list, range],
        "tsne_samples": [Interval(Integral, 2, None, closed="left")],
        "dec_options": [dict, None],
        "random_state": [Interval(Integral, 0, 2**32 - 1, closed="both")],
    }

    def __init__(self, k_range: Sequence[int] = tuple(range(5, 16)), tsne_samples: int = 5000,
                 dec_options: dict | None = None, random_state: int = 0) -> None:
        self.k_range = k_range
        self.tsne_samples = tsne_samples
        self.dec_options = dec_options
        self.random_state = random_state

    def _check_params_vs_input(self, x: NDArray[np.float32]) -> None:
        ks = list(self.k_range)
        if not ks or not all(isinstance(k, Integral) and k >= 1 for k in ks):
            raise ValueError(f"k_range must be a non-empty sequence of positive ints (candidate "
                             f"K, e.g. range(5, 16)), got {self.k_range!r}")
        if x.shape[0] <= max(ks):
            raise ValueError(f"n_samples={x.shape[0]} should be > max(k_range)={max(ks)} (the "
                             "silhouette needs fewer clusters than samples): pass more samples "
                             "or lower k_range")

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: object = None) -> CentralizedDEC:
        """Pretrain once, embed a subset with t-SNE, run DEC for each K and keep the best.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : Ignored

        Returns
        -------
        self : CentralizedDEC
        """
        from sklearn.manifold import TSNE
        from sklearn.metrics import silhouette_score

        x = validate_data(self, X, dtype=np.float32)
        self._check_params_vs_input(x)
        opts = dict(self.dec_options or {})
        base = DEC(n_clusters=2, random_state=self.random_state, **opts).pretrain(x)
        rng = np.random.default_rng(self.random_state)
        sub = rng.choice(len(x), size=min(self.tsne_samples, len(x)), replace=False)
        # t-SNE needs perplexity < n_samples; 30 is its default (tiny data only goes lower)
        tsne = TSNE(2, random_state=self.random_state, init="pca",
                    perplexity=min(30.0, len(sub) - 1.0))
        coords = tsne.fit_transform(base.embed(x[sub]))
        state = ({k: v.clone() for k, v in base.encoder_.state_dict().items()})
        self.scores_: dict[int, float] = {}
        self.labels_by_k_: dict[int, NDArray] = {}
        for k in self.k_range:
            base.encoder_.load_state_dict(state)
            base.n_clusters = int(k)
            base._refine(x)
            self.labels_by_k_[int(k)] = base.labels_.copy()
            lab = base.labels_[sub]
            self.scores_[int(k)] = (float(silhouette_score(coords, lab))
                                    if 1 < np.unique(lab).size < len(lab) else -1.0)
        self.n_clusters_ = max(self.scores_, key=self.scores_.get)
        self.labels_ = self.labels_by_k_[self.n_clusters_]
        return self
