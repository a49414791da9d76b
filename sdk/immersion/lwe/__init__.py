"""``coding="lwe"``: linear controllers run by a cloud on RLWE ciphertexts, gains encrypted.

The cloud holds the controller's coefficients **encrypted** and does all of its arithmetic on
encrypted signals; the plant encrypts ``y`` (with the last applied ``u``), decrypts ``u`` and
checks it. After set-up the plant never touches a coefficient, and its work and bytes per sample
do not depend on the controller's order. The scheme is that of Lee, Lee, Kim and Shim (arXiv
2307.03451; CDSL ``ctrRLWE``): the controller's input-output history form, RLWE (BGV)
ciphertexts of the coefficients and of the signals, rotation-free packing, ciphertext products
decrypted without relinearisation, the history kept encrypted in the cloud, ``u`` re-encrypted by
the plant each sample. Two secret check rows authenticate every reply (:mod:`.controller`).

Modules: :mod:`.convert` (controller to history form), :mod:`.rns` (the ring, NTT),
:mod:`.kernels` (hot loops, numba when installed), :mod:`.rlwe` (keys, encryption),
:mod:`.controller` (design from a requested precision, cloud target, plant handle, twin),
:mod:`.params` (the HE standard's table), :mod:`.examples` (test loops).

Examples
--------
>>> import numpy as np
>>> from immersion.lwe import encrypt_controller
>>> pi = ([[1.0]], [[0.05]], [[1.0]], [[2.0]])                 # PI: x+ = x + 0.05 e, u = x + 2 e
>>> ctrl = encrypt_controller(pi, input_range=10.0, output_range=100.0, rng=0)
>>> twin = ctrl.fixed_point_twin()                # same integers, no encryption
>>> xt = ctrl.encode_state()
>>> for e in (1.0, 0.5, -0.25):
...     yt = ctrl.encode_input([e])               # plant: y (and the last u), encrypted
...     u = ctrl.decode_output(ctrl.target.output(xt, yt), yt)   # cloud computes, plant checks
...     xt = ctrl.target.step(xt, yt)             # cloud: keeps the encrypted history
...     assert u[0] == twin.output([e])[0]        # bit-identical, every sample
>>> round(float(u[0]), 4)                         # x = 0.05 (1 + 0.5) = 0.075; u = x - 0.5
-0.425
>>> ctrl.design.degree, ctrl.design.security_bits
(4096, 128)
"""

from __future__ import annotations

from typing import Any

from .controller import (
    CHECK_ROWS,
    CiphertextIntegrityError,
    ControllerDesign,
    ControllerTarget,
    EncryptedController,
    FixedPointTwin,
    WrapAroundError,
    encrypt_history,
    ranges,
)
from .convert import history_form, linear_controller
from .params import HE_STANDARD_SOURCE, HE_STANDARD_TERNARY


def encrypt_controller(
    sys: Any,
    *,
    input_range: Any = None,
    output_range: Any = None,
    precision: float = 1e-4,
    rng: Any = None,
    secure: bool = False,
    security_bits: int | None = 128,
    degree: int | None = None,
    n_primes: int | None = None,
    prg: str = "auto",
) -> EncryptedController:
    """Encrypt a discrete-time LTI controller, gains included: plant handle plus cloud target.

    Parameters
    ----------
    sys:
        ``(A, B, C, D)`` of ``x+ = A x + B y``, ``u = C x + D y``, or a discrete-time
        ``control.StateSpace`` / ``control.TransferFunction``. Nonlinear systems are refused,
        and so are continuous-time ones (``dt=0``) and ``dt=None``: discretise with ``c2d``.
    input_range, output_range:
        Bounds on ``|y|`` and ``|u|`` (scalar or per component), required. They size the scales
        and prove that no ciphertext wraps around; values outside raise
        :class:`WrapAroundError` at run time.
    precision:
        The largest one-step error of ``u`` allowed, relative to ``output_range`` (proven: from
        the same past, ``|u - u_float| <= precision * output_range``). It picks the ring degree
        (4096, else 8192), modulus, plaintext modulus and scales; what cannot be reached is
        refused naming the smallest reachable precision (never degraded silently).
    rng, secure:
        ``rng=None`` (default) or ``secure=True``: the master secret is 32 bytes of OS entropy.
        An int seed or numpy Generator makes keys and noise reproducible (tests, benchmarks):
        the seed is then the key.
    security_bits:
        HE-standard level (128, 192, 256) of the ``(N, log2 Q)`` pair; ``None`` only with an
        explicit ``degree`` and ``n_primes`` (no security claim: tests of tiny rings).
    degree, n_primes:
        Force the ring degree (and, without a security claim, the number of 25-bit primes).
    prg:
        Expander of the public part of ciphertexts: ``"aes128-ctr"`` (needs ``cryptography``),
        ``"shake128"``, or ``"auto"``.

    Returns
    -------
    EncryptedController
        ``encode_state``, ``encode_input``, ``decode_output``, ``target`` (the cloud's part,
        picklable, no secret), ``design``, ``report()``, ``fixed_point_twin()``.

    Examples
    --------
    >>> ctrl = encrypt_controller(([[0.5]], [[1.0]], [[0.3]], [[0.0]]), input_range=1,
    ...                           output_range=1, rng=0, precision=1e-6)
    >>> ctrl.design.degree, ctrl.design.precision <= 1e-6    # 1e-6 needs N = 8192
    (8192, True)
    """
    controller = linear_controller(sys)
    history = history_form(controller)
    return encrypt_history(
        history,
        input_range=ranges("input_range", input_range, controller.n_input),
        output_range=ranges("output_range", output_range, controller.n_output),
        precision=_precision(precision),
        security_bits=security_bits,
        degree=degree,
        n_primes=n_primes,
        rng=rng,
        secure=secure,
        prg=prg,
    )


#: The gains are always encrypted now: the name of ``immerse_system(..., hide_gains=True)``.
encrypt_controller_and_gains = encrypt_controller


def _precision(value: Any) -> float:
    from ..errors import InvalidArgumentError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise InvalidArgumentError(
            "precision", f"expected a number in (0, 1) relative to output_range, got {value!r}"
        )
    return float(value)


#: The names of earlier versions, for code that imported them.
LweImmersion = EncryptedController
LweTarget = ControllerTarget

__all__ = [
    "encrypt_controller",
    "encrypt_controller_and_gains",
    "EncryptedController",
    "ControllerTarget",
    "ControllerDesign",
    "FixedPointTwin",
    "WrapAroundError",
    "CiphertextIntegrityError",
    "CHECK_ROWS",
    "HE_STANDARD_TERNARY",
    "HE_STANDARD_SOURCE",
    "LweImmersion",
    "LweTarget",
]
