"""X25519 (RFC 7748) and HKDF-SHA256 (RFC 5869) in plain Python, for machines without the
``cryptography`` package.

:mod:`fedclust.emdcfl.privacy` uses ``cryptography`` when it is installed (it is a dependency
of fedclust) and these functions otherwise; both give the same bytes (tested against
``cryptography`` and the RFC test vectors). They serve the *simulated* key pairs, which derive
from the run seed and are not secret anyway: a Flower-free in-memory simulation (e.g. a GPU
check on a machine with only torch and numpy) then needs no compiled extension. Python's big
integers do not run in constant time, so :func:`fedclust.emdcfl.privacy.generate_keypair` (the
fresh keys of a deployed node) still requires ``cryptography``.
"""

from __future__ import annotations

import hashlib
import hmac

P = 2**255 - 19
A24 = 121665
BASE_POINT = (9).to_bytes(32, "little")


def _scalar(k: bytes) -> int:
    b = bytearray(k)
    b[0] &= 248
    b[31] &= 127
    b[31] |= 64
    return int.from_bytes(b, "little")


def x25519(k: bytes, u: bytes) -> bytes:
    """The X25519 function of RFC 7748 §5: scalar ``k`` times the point of u-coordinate ``u``
    (Montgomery ladder), both 32 little-endian bytes.

    Raises
    ------
    ValueError
        Wrong lengths, or an all-zero result (a low-order point: what ``cryptography``'s
        ``exchange`` refuses too).
    """
    if len(k) != 32 or len(u) != 32:
        raise ValueError("X25519 keys are 32 bytes")
    scalar = _scalar(k)
    ub = bytearray(u)
    ub[31] &= 127
    x1 = int.from_bytes(ub, "little") % P
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in range(254, -1, -1):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % P, (x2 - z2) % P
        aa, bb = a * a % P, b * b % P
        e = (aa - bb) % P
        c, d = (x3 + z3) % P, (x3 - z3) % P
        da, cb = d * a % P, c * b % P
        x3, z3 = (da + cb) ** 2 % P, x1 * (da - cb) ** 2 % P
        x2, z2 = aa * bb % P, e * (aa + A24 * e) % P
    if swap:
        x2, z2 = x3, z3
    out = x2 * pow(z2, P - 2, P) % P
    if out == 0:
        raise ValueError("X25519 shared secret is all zeros (low-order public key)")
    return out.to_bytes(32, "little")


def public_key(private: bytes) -> bytes:
    """The public key (u-coordinate) of a raw 32-byte private key."""
    return x25519(private, BASE_POINT)


def hkdf_sha256(ikm: bytes, length: int, info: bytes, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``ikm``; no salt means 32 zero bytes, as in ``cryptography``."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(-(-int(length) // 32)):
        block = hmac.new(prk, block + info + bytes([i + 1]), hashlib.sha256).digest()
        out += block
    return out[:length]
