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

import numpy as np
import torch
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.cluster import KMeans


def _mlp(sizes: Sequence[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DEC(BaseEstimator, ClusterMixin):
    """Deep Embedded Clustering as a scikit-learn estimator.

    Parameters
    ----------
    n_clusters : int
    hidden : sequence of int, encoder sizes (default 500-500-2000-10)
    pretrain_epochs : int, autoencoder epochs (Adam, lr 1e-3)
    batch_size : int (DEC: 256)
    maxiter : int, KL-refinement iterations (mini-batches)
    update_interval : int, iterations between target-distribution updates
    tol : float, stop when the share of changed labels falls below it
    lr : float, SGD learning rate of the KL stage (momentum 0.9)
    random_state : int
    """

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

    def _build(self, d: int) -> None:
        torch.manual_seed(self.random_state)
        sizes = [d, *self.hidden]
        self.encoder_ = _mlp(sizes)
        self.decoder_ = _mlp(sizes[::-1])

    def pretrain(self, x: NDArray) -> DEC:
        """Step 1: train the autoencoder on reconstruction (MSE)."""
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
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
        return self

    @torch.no_grad()
    def embed(self, x: NDArray) -> NDArray[np.float32]:
        """Embedding z = encoder(x)."""
        return self.encoder_(torch.as_tensor(np.asarray(x, dtype=np.float32))).numpy()

    @staticmethod
    def _soft(z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        q = 1.0 / (1.0 + torch.cdist(z, mu) ** 2)
        return q / q.sum(1, keepdim=True)

    def fit(self, x: NDArray, y: None = None) -> DEC:
        """Steps 2–3 (pretraining first if not done)."""
        if not hasattr(self, "encoder_"):
            self.pretrain(x)
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
        z = self.embed(x)
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
        return self

    def predict(self, x: NDArray) -> NDArray[np.int64]:
        with torch.no_grad():
            z = self.encoder_(torch.as_tensor(np.asarray(x, dtype=np.float32)))
            return self._soft(z, torch.as_tensor(self.cluster_centers_)).argmax(1).numpy()


class CentralizedDEC(BaseEstimator, ClusterMixin):
    """Paper 000 Table 2 baseline: DEC on the pooled data, K chosen by the silhouette score of
    the DEC labels on a 2-D t-SNE of the (pretrained) embedding.

    Parameters
    ----------
    k_range : sequence of int, candidate K
    tsne_samples : int, samples embedded by t-SNE (a random subset, for time)
    dec_options : keyword arguments of :class:`DEC`
    random_state : int
    """

    def __init__(self, k_range: Sequence[int] = tuple(range(5, 16)), tsne_samples: int = 5000,
                 dec_options: dict | None = None, random_state: int = 0) -> None:
        self.k_range = k_range
        self.tsne_samples = tsne_samples
        self.dec_options = dec_options
        self.random_state = random_state

    def fit(self, x: NDArray, y: None = None) -> CentralizedDEC:
        from sklearn.manifold import TSNE
        from sklearn.metrics import silhouette_score

        opts = dict(self.dec_options or {})
        base = DEC(n_clusters=2, random_state=self.random_state, **opts).pretrain(x)
        rng = np.random.default_rng(self.random_state)
        sub = rng.choice(len(x), size=min(self.tsne_samples, len(x)), replace=False)
        coords = TSNE(2, random_state=self.random_state, init="pca").fit_transform(
            base.embed(x[sub]))
        state = ({k: v.clone() for k, v in base.encoder_.state_dict().items()})
        self.scores_: dict[int, float] = {}
        self.labels_by_k_: dict[int, NDArray] = {}
        for k in self.k_range:
            base.encoder_.load_state_dict(state)
            base.n_clusters = int(k)
            base.fit(x)
            self.labels_by_k_[int(k)] = base.labels_.copy()
            lab = base.labels_[sub]
            self.scores_[int(k)] = (float(silhouette_score(coords, lab))
                                    if np.unique(lab).size > 1 else -1.0)
        self.n_clusters_ = max(self.scores_, key=self.scores_.get)
        self.labels_ = self.labels_by_k_[self.n_clusters_]
        return self
