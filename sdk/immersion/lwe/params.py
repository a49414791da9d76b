"""LWE parameters from the Homomorphic Encryption Security Standard (ternary secret, sigma 3.2).

The standard's tables give, for a lattice dimension ``n`` and a security level, the largest
modulus (as ``log2 q``) for which the best known attacks (primal uSVP, decoding, dual, run through
the LWE estimator) cost at least ``2^level`` operations. We read them for a **ternary secret**
(uniform on ``{-1, 0, 1}``) and error width ``sigma = 8 / sqrt(2 pi) ~ 3.2``, classical attacks.
"""

from __future__ import annotations

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
