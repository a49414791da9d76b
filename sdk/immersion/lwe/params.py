"""LWE parameters from the Homomorphic Encryption Security Standard (ternary secret, sigma 3.2).

The standard's tables give, for a lattice dimension ``n`` and a security level, the largest
modulus (as ``log2 q``) for which the best known attacks (primal uSVP, decoding, dual, run through
the LWE estimator) cost at least ``2^level`` operations. We read them for a **ternary secret**
(uniform on ``{-1, 0, 1}``) and error width ``sigma = 8 / sqrt(2 pi) ~ 3.2``, classical attacks.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any

from .._validation import positive_int
from ..errors import InvalidArgumentError

#: Where :data:`HE_STANDARD_TERNARY` comes from. The standard's tables are cited without a section
#: or table number; the entries are those of Microsoft SEAL's ``hestdparms.h`` (functions
#: ``SEAL_HE_STD_PARMS_{128,192,256}_TC``: ternary secret, classical), entry for entry.
HE_STANDARD_SOURCE = (
    "M. Albrecht et al., Homomorphic Encryption Security Standard, HomomorphicEncryption.org, "
    "Toronto, November 2018 (v1.1; also IACR ePrint 2019/939), its tables of recommended "
    "parameters for a uniform ternary secret in {-1, 0, 1}, error sigma = 8/sqrt(2 pi) ~ 3.2, "
    "classical security; the same numbers, entry for entry, are those of Microsoft SEAL, "
    "native/src/seal/util/hestdparms.h (SEAL_HE_STD_PARMS_128_TC, _192_TC, _256_TC)"
)

#: ``HE_STANDARD_TERNARY[level][n]``: the largest ``log2 q`` at which LWE of dimension ``n`` with a
#: ternary secret and error width 3.2 reaches ``level`` bits of classical security.
HE_STANDARD_TERNARY: dict[int, dict[int, int]] = {
    128: {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881},
    192: {1024: 19, 2048: 37, 4096: 75, 8192: 152, 16384: 305, 32768: 611},
    256: {1024: 14, 2048: 29, 4096: 58, 8192: 118, 16384: 237, 32768: 476},
}

#: Error width of the tables (the standard's ``8 / sqrt(2 pi) = 3.19``, rounded up as SEAL does).
ERROR_SIGMA = 3.2
#: Errors are drawn from the discrete Gaussian of width :data:`ERROR_SIGMA` restricted to
#: ``|e| <= 19`` (6 sigma, as SEAL's clipped normal sampler; the mass cut off is 2e-9), so every
#: noise bound in this package is a certainty, not a probability.
ERROR_BOUND = 19
#: Moduli offered: ``q = 2^bits`` for ``bits`` in this range; up to 64 one uint64 word per
#: element (``q = 2^64``: the fast path), above two words (more precision).
MODULUS_BITS = range(32, 129)


@dataclass(frozen=True)
class LweParameters:
    """Dimension, modulus and error law of the LWE encryption, with the table row they rest on.

    Parameters
    ----------
    dimension:
        LWE dimension ``n`` (length of the secret key).
    modulus_bits:
        ``log2 q``: ``q = 2^modulus_bits``, 32 to 128 (64: one uint64 word per element).
    security_bits:
        Classical security level from :data:`HE_STANDARD_TERNARY`, or ``None`` for a dimension
        chosen by hand without a security claim (benchmarks only).
    table_max_modulus_bits:
        The table's largest ``log2 q`` for the table dimension used (``None`` without a claim).
    table_dimension:
        The table row used: the largest tabulated ``n`` not above ``dimension``.
    sigma, error_bound:
        Error width and clipping bound (:data:`ERROR_SIGMA`, :data:`ERROR_BOUND`).
    source:
        Where the table comes from.
    """

    dimension: int
    modulus_bits: int
    security_bits: int | None
    table_dimension: int | None
    table_max_modulus_bits: int | None
    sigma: float = ERROR_SIGMA
    error_bound: int = ERROR_BOUND
    source: str = HE_STANDARD_SOURCE

    @property
    def limbs(self) -> int:
        """uint64 words per element of ``Z_q``."""
        return 1 if self.modulus_bits <= 64 else 2

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def lwe_parameters(
    *, security_bits: int | None = 128, modulus_bits: int = 64, dimension: int | None = None
) -> LweParameters:
    """The LWE parameters for a security level and modulus, from the HE standard's ternary table.

    Parameters
    ----------
    security_bits:
        128, 192 or 256 (classical); ``None`` only with an explicit ``dimension`` and no claim.
    modulus_bits:
        ``log2 q``, 32 to 128: 64 (``q = 2^64``, uint64 words) by default; above 64 two 64-bit
        limbs per element, for more precision (e.g. 104, the most ``n = 4096`` allows at 128 bits).
    dimension:
        LWE dimension ``n``. Default: the smallest tabulated ``n`` whose largest ``log2 q`` is at
        least ``modulus_bits``. Given with a security level, it must reach that level.

    Returns
    -------
    LweParameters

    Examples
    --------
    >>> p = lwe_parameters(security_bits=128)
    >>> p.dimension, p.modulus_bits, p.table_max_modulus_bits
    (4096, 64, 109)
    >>> lwe_parameters(security_bits=256).dimension        # 4096 allows only log2 q <= 58
    8192
    >>> lwe_parameters(security_bits=128, modulus_bits=104).dimension   # 4096 allows up to 109
    4096
    >>> lwe_parameters(security_bits=128, modulus_bits=128).dimension
    8192
    """
    if (
        isinstance(modulus_bits, bool)
        or not isinstance(modulus_bits, numbers.Integral)
        or int(modulus_bits) not in MODULUS_BITS
    ):
        raise InvalidArgumentError(
            "modulus_bits", f"expected an integer from 32 to 128, got {modulus_bits!r}"
        )
    modulus_bits = int(modulus_bits)
    if dimension is not None:
        dimension = positive_int("dimension", dimension, minimum=2)
    if security_bits is None:
        if dimension is None:
            raise InvalidArgumentError(
                "security_bits", "None (no security claim) needs an explicit dimension"
            )
        return LweParameters(dimension, modulus_bits, None, None, None)
    if isinstance(security_bits, bool) or security_bits not in HE_STANDARD_TERNARY:
        raise InvalidArgumentError(
            "security_bits",
            f"expected one of {sorted(HE_STANDARD_TERNARY)} (HE standard tables), "
            f"or None with an explicit dimension; got {security_bits!r}",
        )
    table = HE_STANDARD_TERNARY[security_bits]
    if dimension is None:
        row = min(n for n, bits in table.items() if bits >= modulus_bits)
        return LweParameters(row, modulus_bits, security_bits, row, table[row])
    rows = [n for n in table if n <= dimension]
    if not rows or table[max(rows)] < modulus_bits:
        needed = min(n for n, bits in table.items() if bits >= modulus_bits)
        have = f"n = {max(rows)} allows log2 q <= {table[max(rows)]}" if rows else "too small"
        raise InvalidArgumentError(
            "dimension",
            f"{dimension} does not reach {security_bits}-bit security with q = 2^{modulus_bits} "
            f"({have}); the HE standard's ternary table needs n >= {needed}",
        )
    row = max(rows)
    return LweParameters(dimension, modulus_bits, security_bits, row, table[row])
