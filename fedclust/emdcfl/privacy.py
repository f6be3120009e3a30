"""Pairwise key agreement and the private random projection of EMD-CFL (paper 001, §3).

Each pair of clients ``(c, o)`` must agree on a projection matrix ``R_co`` that the server never
learns. Each client makes an X25519 key pair per run and the server relays only the public keys.
Both members of a pair compute the same X25519 shared secret. Its HKDF-SHA256 expansion, with
``info = b"fedclust-emdcfl|<min id>|<max id>|<purpose>"``, seeds a numpy ``Generator`` that
draws ``R_co`` and the subsample indices. The server sees public keys and projected embeddings
only, never the secret or the seed. A server that swaps public keys (an active attacker) is out
of scope: the keys would then need authentication.

The projection follows the authors' code: ``R = randn(d, k) / sqrt(d)`` with ``k = int(ratio·d)``,
then each *row* scaled to unit norm (``F.normalize(R, dim=1)``). One matrix per pair is used for
both the pair distance and the source client's reference distance (unlike the authors' code).
``kind="orthogonal"`` (a deviation, key ``emdcfl.projection``) replaces the columns of the same
Gaussian draw by an orthonormal basis of their span (``Q`` of its QR decomposition), so that
``R`` is an isometry onto a random ``k``-dimensional subspace: lengths and angles inside it are
kept, where the Gaussian matrix also distorts them.

Reproducible simulation: a *simulated* node (node config with ``partition-id`` and no
``data-path``, or a site file of ``dataset="files"``: :func:`fedclust.data.sites.is_simulated`,
re-exported here) derives its key pair from the run seed and its partition id
(:func:`simulated_keypair`), and the pair seeds of simulated nodes name the two members by
:func:`key_id` of their public keys instead of Flower node ids (random in every simulation run).
The same seed then gives the same projections and subsamples. Such keys are known to anyone who
knows the seed (the server included): fine for experiments, never used by a deployed node
(:func:`node_keypair` gives those fresh keys from the OS).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.data.sites import is_simulated  # re-exported: the one rule for every method

try:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:      # a bare machine: the plain-Python X25519/HKDF (same bytes, simulated
    HKDF = None          # keys only; see fedclust.emdcfl.x25519)

PURPOSE = "projection"


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair as raw bytes ``(private 32 B, public 32 B)``.

    Raises
    ------
    ImportError
        ``cryptography`` is not installed (a deployed node's secret keys need its
        constant-time implementation).
    """
    if HKDF is None:
        raise ImportError("a deployed EMD-CFL node's fresh X25519 keys need the 'cryptography' "
                          "package (pip install 'cryptography>=42'; fedclust depends on it)")
    return _raw_pair(X25519PrivateKey.generate())


def _raw_pair(key: X25519PrivateKey) -> tuple[bytes, bytes]:
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw)
    return private, public


def _hkdf(ikm: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 of ``ikm`` to 32 bytes, no salt."""
    if HKDF is None:
        from fedclust.emdcfl.x25519 import hkdf_sha256

        return hkdf_sha256(ikm, 32, info)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(ikm)


def simulated_keypair(seed: int, partition: int) -> tuple[bytes, bytes]:
    """The X25519 key pair of simulated partition ``partition`` in a run with ``seed``.

    HKDF-SHA256 of the seed and the partition id: the same (seed, partition) always gives the
    same pair, so simulation runs are reproducible. **Not secret** from anyone who knows the
    run seed; only for simulated nodes (see :func:`node_keypair`).
    """
    ikm = f"fedclust-emdcfl|seed={int(seed)}|partition={int(partition)}".encode()
    raw = _hkdf(ikm, b"fedclust-emdcfl|simulated-x25519-key")
    if HKDF is None:
        from fedclust.emdcfl.x25519 import public_key

        return raw, public_key(raw)
    return _raw_pair(X25519PrivateKey.from_private_bytes(raw))


def node_keypair(node_config: Mapping[str, Any], seed: int,
                 cfg: Mapping[str, Any] | None = None) -> tuple[bytes, bytes]:
    """This node's key pair: derived from ``seed`` and its ``partition-id`` when simulated
    (:func:`fedclust.data.sites.is_simulated` with the run config ``cfg``: a partition, or a
    site file of ``dataset="files"``), else fresh from the OS (:func:`generate_keypair`)."""
    if is_simulated(node_config, cfg):
        return simulated_keypair(seed, int(node_config["partition-id"]))
    return generate_keypair()


def key_id(public: bytes) -> int:
    """A 63-bit id of a public key (SHA-256): names a simulated node in its pair seeds, since
    Flower's simulated node ids change from run to run while its key does not."""
    digest = hashlib.sha256(b"fedclust-emdcfl|key-id|" + bytes(public)).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def shared_secret(private: bytes, peer_public: bytes) -> bytes:
    """X25519 Diffie–Hellman shared secret (32 B); equal for both members of a pair."""
    if HKDF is None:
        from fedclust.emdcfl.x25519 import x25519

        return x25519(bytes(private), bytes(peer_public))
    return X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public))


def pair_seed(secret: bytes, id_a: int, id_b: int, purpose: str = PURPOSE) -> bytes:
    """HKDF-SHA256(secret, info = sorted ids + purpose) → 32-byte pair seed."""
    lo, hi = sorted((int(id_a), int(id_b)))
    return _hkdf(secret, f"fedclust-emdcfl|{lo}|{hi}|{purpose}".encode())


def pair_generators(seed: bytes) -> dict[str, np.random.Generator]:
    """Independent generators derived from a pair seed: ``projection``, ``sub-a``, ``sub-b``.

    ``sub-a``/``sub-b`` subsample the data of the lower/higher client id of the pair.
    """
    entropy = int.from_bytes(seed, "big")
    children = np.random.SeedSequence(entropy).spawn(3)
    return {name: np.random.default_rng(ch)
            for name, ch in zip(("projection", "sub-a", "sub-b"), children)}


def projection_dim(dim: int, ratio: float) -> int:
    """Columns of ``R``: ``int(ratio·dim)``, at least 1 (the authors' ``proj_dim``)."""
    return max(1, int(ratio * dim))


PROJECTIONS = ("gaussian", "orthogonal")


def projection_matrix(rng: np.random.Generator, dim: int, ratio: float,
                      kind: str = "gaussian") -> NDArray[np.float32]:
    """``R`` of shape ``(dim, k)``, ``k = int(ratio·dim)``.

    ``gaussian`` (the authors'): ``randn(dim, k) / sqrt(dim)``, rows scaled to unit norm.
    ``orthogonal``: ``Q`` of the QR decomposition of the same draw (``QᵀQ = I_k``), column
    signs fixed by ``diag(R) > 0`` so that the draw determines ``Q``.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"projection ratio must be in (0, 1], got {ratio}")
    if kind not in PROJECTIONS:
        raise ValueError(f"projection must be one of {PROJECTIONS}, got {kind!r}")
    k = projection_dim(dim, ratio)
    r = rng.standard_normal((dim, k)) / np.sqrt(dim)
    if kind == "orthogonal":
        q, tri = np.linalg.qr(r)
        return (q * np.where(np.diag(tri) < 0, -1.0, 1.0)).astype(np.float32)
    r /= np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
    return r.astype(np.float32)


def subsample(rng: np.random.Generator, n: int, max_samples: int) -> NDArray[np.int64]:
    """Indices of at most ``max_samples`` of ``n`` points, without replacement (sorted)."""
    if n <= max_samples:
        return np.arange(n)
    return np.sort(rng.choice(n, size=max_samples, replace=False))


class PairContext:
    """What one client derives for its pair with ``peer``: ``R`` and its own subsample rng."""

    def __init__(self, private: bytes, own_id: int, peer_id: int, peer_public: bytes,
                 dim: int, ratio: float, kind: str = "gaussian",
                 secret: bytes | None = None) -> None:
        # ``secret``: the pair's shared secret when the caller already has it (an in-memory
        # simulation computes it once per pair, not once per member)
        if secret is None:
            secret = shared_secret(private, peer_public)
        seed = pair_seed(secret, own_id, peer_id)
        gens = pair_generators(seed)
        self.R = projection_matrix(gens["projection"], dim, ratio, kind)
        self.rng = gens["sub-a"] if int(own_id) < int(peer_id) else gens["sub-b"]

    def project(self, emb: NDArray, max_samples: int) -> NDArray[np.float32]:
        """Subsample (≤ ``max_samples``) then project ``emb`` with ``R``."""
        idx = subsample(self.rng, len(emb), max_samples)
        return (emb[idx] @ self.R).astype(np.float32)
