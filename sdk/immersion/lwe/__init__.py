"""``coding="lwe"``: linear controllers run by a cloud on LWE ciphertexts that it cannot read.

The cloud holds a public integer matrix and a window of ciphertexts of past measurements ``y``
and applied controls ``u``; it never decrypts anything. The user encrypts ``y`` (and feeds the
applied ``u`` back, encrypted), and decrypts ``u`` by subtracting the pad ``<a, s> + e`` it
computed for that ciphertext (it drew every error), so the decoded ``u`` is bit-identical to a
fixed-point twin of the controller (no noise bits reach the plant) and the noise takes no bits of
the modulus.

Modules: :mod:`.params` (HE-standard parameters), :mod:`.ring` (``Z_{2^64}``, ``Z_{2^128}``),
:mod:`.keys` (secret, seeded public vectors, errors), :mod:`.convert` (controller to history
form), :mod:`.fixed_point` (scales, bits budget, twin), :mod:`.encryption`, :mod:`.target`
(cloud), :mod:`.handle` (user), :mod:`.report`; :mod:`.hidden` encrypts the gains too
(:func:`encrypt_controller_and_gains`, BFV through TenSEAL).

Examples
--------
>>> import numpy as np
>>> from immersion.lwe import encrypt_controller
>>> pi = ([[1.0]], [[0.05]], [[1.0]], [[2.0]])                 # PI: x+ = x + 0.05 e, u = x + 2 e
>>> imm = encrypt_controller(pi, input_range=10.0, output_range=100.0, rng=0)
>>> twin = imm.fixed_point_twin()                 # same integers, no encryption
>>> xt = imm.encode_state(np.zeros(1))
>>> for e in (1.0, 0.5, -0.25):
...     yt = imm.encode_input([e])                # user: y (and the last u), encrypted
...     u = imm.decode_output(imm.target.output(xt, yt), yt)
...     xt = imm.target.step(xt, yt)              # cloud: integer matrix on ciphertexts
...     assert u[0] == twin.output([e])[0]        # bit-identical, every sample
>>> round(float(u[0]), 4)                         # x = 0.05 (1 + 0.5) = 0.075; u = x - 0.5
-0.425
>>> imm.report().parameters.dimension, imm.report().parameters.security_bits
(4096, 128)
"""

from __future__ import annotations

from typing import Any

from .convert import history_form, linear_controller
from .encryption import public_part
from .fixed_point import CHECK_BITS, FixedPointTwin, WrapAroundError, design, ranges
from .handle import CiphertextIntegrityError, LweImmersion
from .hidden import HiddenGainsImmersion, HiddenGainsTarget, encrypt_controller_and_gains
from .keys import LweSecretKey, resolve_prg
from .params import HE_STANDARD_SOURCE, HE_STANDARD_TERNARY, LweParameters, lwe_parameters
from .report import LweReport
from .target import LweTarget


def encrypt_controller(
    sys: Any,
    *,
    input_range: Any = None,
    output_range: Any = None,
    rng: Any = None,
    secure: bool = False,
    security_bits: int | None = 128,
    modulus_bits: int = 64,
    dimension: int | None = None,
    fractional_bits: tuple[int, int, int] | None = None,
    prg: str = "auto",
) -> LweImmersion:
    """LWE-encrypt a discrete-time LTI controller: user handle plus cloud target.

    Parameters
    ----------
    sys:
        ``(A, B, C, D)`` of ``x+ = A x + B y``, ``u = C x + D y``, or a discrete-time
        ``control.StateSpace`` / ``control.TransferFunction`` (as :func:`immersion.immerse_system`
        takes them). Nonlinear systems are refused, and so are continuous-time ones (``dt=0``)
        and ``dt=None``: discretise with ``control.c2d``.
    input_range, output_range:
        Bounds on ``|y|`` and ``|u|`` (scalar or per component), required. They size the
        fixed-point scales and prove that no ciphertext can wrap around ``q``; values outside
        raise :class:`WrapAroundError` at run time.
    rng, secure:
        ``rng=None`` (default) or ``secure=True``: the master secret is 32 bytes of OS entropy
        (``secrets.token_bytes``; deployments). An int seed or numpy Generator makes the key
        reproducible (tests, benchmarks): the seed is then the key.
    security_bits, modulus_bits, dimension:
        HE-standard level (128, 192, 256), ``q = 2^64`` or ``2^128`` (more precision), and an
        optional LWE dimension (``security_bits=None`` with a dimension: no claim, benchmarks).
    fractional_bits:
        ``(f_y, f_u, f_c)`` to override the automatic scaling (checked against the budget).
    prg:
        Expander of the public vectors: ``"aes128-ctr"`` (extra ``lwe``: cryptography),
        ``"shake128"`` (standard library), or ``"auto"``.

    Returns
    -------
    LweImmersion
        ``encode_state``, ``encode_input``, ``decode_output``, ``target``, ``report()``,
        ``fixed_point_twin()``.

    Examples
    --------
    >>> imm = encrypt_controller(([[0.5]], [[1.0]], [[0.3]], [[0.0]]), input_range=1,
    ...                          output_range=1, rng=0, security_bits=256)
    >>> r = imm.report()
    >>> r.parameters.dimension, r.window, r.headroom_bits > 0
    (8192, 1, True)
    """
    params = lwe_parameters(
        security_bits=security_bits, modulus_bits=modulus_bits, dimension=dimension
    )
    prg = resolve_prg(prg)
    controller = linear_controller(sys)
    history = history_form(controller)
    in_range = ranges("input_range", input_range, controller.n_input)
    out_range = ranges("output_range", output_range, controller.n_output)
    fp = design(
        history,
        input_range=in_range,
        output_range=out_range,
        modulus_bits=params.modulus_bits,
        error_bound=params.error_bound,
        fractional_bits=fractional_bits,
        scale_bits=CHECK_BITS,
    )
    key = LweSecretKey.generate(params, rng=rng, secure=secure)
    return LweImmersion(
        key=key,
        controller=controller,
        history=history,
        design=fp,
        input_range=in_range,
        output_range=out_range,
        prg=prg,
    )


__all__ = [
    "encrypt_controller",
    "encrypt_controller_and_gains",
    "LweImmersion",
    "LweTarget",
    "HiddenGainsImmersion",
    "HiddenGainsTarget",
    "LweReport",
    "LweParameters",
    "lwe_parameters",
    "HE_STANDARD_TERNARY",
    "HE_STANDARD_SOURCE",
    "FixedPointTwin",
    "WrapAroundError",
    "CiphertextIntegrityError",
    "public_part",
]
