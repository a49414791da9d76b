"""One user's FedSGD update under seed 001's sampling models (Assumptions 1, 2 and Remark 1).

Orientation: the update functions take the paper's matrix ``G = [g_1 ... g_D]`` of shape ``(K, D)``,
one clipped per-example gradient per *column* (``K`` = model dimension, ``D`` = samples of the
user, eq. 12). :func:`clip_rows` is the one exception: it takes gradients the way autograd stacks
them, one example per *row*, shape ``(D, K)``, and returns the same shape, so a user builds
``G = clip_rows(per_example_grads, C).T``.

* :func:`full_gradient_update`: GD, ``x = (1/D) sum_j g_j``;
* :func:`iid_sampling_update`: SGD with IID mini-batch sampling (Remark 1), the mean of ``B``
  columns drawn without replacement;
* :func:`gaussian_sampling_update`: Gaussian sampling (Assumption 2, eq. 17),
  ``x = (1/D) sum_j g_j + G xi / sqrt(B D)`` with ``xi ~ N(0, I_D)``. Its covariance is
  ``G G^T / (B D)`` (eq. 16's ``Sigma_i = G G^T / D`` over ``B``); it costs ``O(K D)`` and never
  forms a ``K x K`` matrix;
* :func:`isotropic_noise`: ``N(0, sigma2 I_K)``, the noise of the SGD-DP and GD-DP rows of Table 1.

The learning rate is left out, as in the paper (section 3): updates are averaged clipped gradients.
"""

from __future__ import annotations

import math
import operator

import numpy as np
from immersion import InvalidArgumentError
from immersion_fl.runtime.optimizers import clip_to_norm


def _generator(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InvalidArgumentError(
            "rng", f"expected a numpy.random.Generator, got {type(rng).__name__}"
        )
    return rng


def _gradients(G: object, name: str = "G") -> np.ndarray:
    """``G`` as a finite float64 ``(K, D)`` matrix with ``K, D >= 1``."""
    try:
        arr = np.asarray(G, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            name, "expected a real (K, D) array of per-example gradients (columns)"
        ) from None
    if arr.ndim != 2 or 0 in arr.shape:
        raise InvalidArgumentError(
            name, f"expected a non-empty 2-D (K, D) array, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(name, "expected finite values")
    return arr


def _batch(batch: object, samples: int) -> int:
    """``B`` as an int with ``1 <= B <= D`` (as in :class:`immersion_secagg.accountant.Setting`)."""
    if isinstance(batch, bool):
        raise InvalidArgumentError("batch", f"expected an integer, got {batch!r}")
    try:
        b = operator.index(batch)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError("batch", f"expected an integer, got {batch!r}") from None
    if not 1 <= b <= samples:
        raise InvalidArgumentError("batch", f"expected 1 <= batch <= D = {samples}, got {b}")
    return b


def _nonnegative(value: object, name: str) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, f"expected a real number, got {value!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise InvalidArgumentError(name, f"expected a finite value >= 0, got {value}")
    return v


def clip_rows(grads: np.ndarray, clip: float) -> np.ndarray:
    """Clip every row: ``clip(x, C) = C x / max(||x||_2, C)`` (section 2, notes 9.14).

    Parameters
    ----------
    grads:
        Per-example gradients, one example per row, shape ``(D, K)``; a 1-D array is one example.
    clip:
        The clip norm ``C > 0``.

    Returns
    -------
    numpy.ndarray
        The same shape, every row of norm ``<= C``; rows already inside the ball are unchanged.
        Transpose to get the paper's ``G`` (``(K, D)``) for the other functions.

    Examples
    --------
    >>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    c = _nonnegative(clip, "clip")
    if c == 0:
        raise InvalidArgumentError("clip", "expected > 0, got 0")
    try:
        arr = np.asarray(grads, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            "grads", "expected a real (D, K) array, one example per row"
        ) from None
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InvalidArgumentError(
            "grads", f"expected a non-empty (D, K) or (K,) array, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError("grads", "expected finite values")
    return clip_to_norm(arr, c)


def full_gradient_update(G: np.ndarray) -> np.ndarray:
    """GD: the mean of the clipped gradients, ``(1/D) sum_j g_j`` (Assumption 1 with ``w = 1/D``).

    Parameters
    ----------
    G : np.ndarray
        Clipped per-example gradients as columns, shape ``(K, D)``.

    Examples
    --------
    >>> full_gradient_update(np.array([[1.0, 3.0], [0.0, 2.0]])).tolist()
    [2.0, 1.0]
    """
    return _gradients(G).mean(axis=1)


def iid_sampling_update(G: np.ndarray, batch: int, rng: np.random.Generator) -> np.ndarray:
    """SGD with IID mini-batch sampling (Remark 1): the mean of ``B`` columns, no replacement.

    ``w`` has exactly ``B`` entries ``1/B``, so the update takes finitely many values and, by
    Theorem 1 (section 4.3), gives no DP without added noise.

    Parameters
    ----------
    G : np.ndarray
        Clipped per-example gradients as columns, shape ``(K, D)``.
    batch : int
        ``B``, ``1 <= B <= D``.
    rng : np.random.Generator
        Source of the batch.

    Examples
    --------
    >>> G = np.array([[1.0, 2.0, 3.0]])
    >>> float(iid_sampling_update(G, 3, np.random.default_rng(0))[0])
    2.0
    """
    g = _gradients(G)
    b = _batch(batch, g.shape[1])
    columns = _generator(rng).choice(g.shape[1], size=b, replace=False)
    return g[:, columns].mean(axis=1)


def gaussian_sampling_update(G: np.ndarray, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian sampling (Assumption 2, eq. 17): ``x = (1/D) sum_j g_j + G xi / sqrt(B D)``.

    ``xi ~ N(0, I_D)``.

    The update is ``N(mean, G G^T / (B D))``: the eq. 16 covariance ``Sigma_i = G G^T / D`` over
    ``B``, whose sum over users is the aggregate covariance of eq. 18. ``O(K D)``; no ``K x K``
    matrix.

    Parameters
    ----------
    G : np.ndarray
        Clipped per-example gradients as columns, shape ``(K, D)``.
    batch : int
        ``B``, the covariance scaling (footnote 2: the SGD batch size), ``1 <= B <= D``.
    rng : np.random.Generator
        Source of ``xi`` (exactly one ``standard_normal(D)`` draw).

    Examples
    --------
    >>> G = np.array([[1.0, -1.0], [2.0, 2.0]])
    >>> x = gaussian_sampling_update(G, 1, np.random.default_rng(0))
    >>> xi = np.random.default_rng(0).standard_normal(2)
    >>> bool(np.allclose(x, G.mean(axis=1) + G @ xi / np.sqrt(2)))
    True
    """
    g = _gradients(G)
    k, d = g.shape
    b = _batch(batch, d)
    xi = _generator(rng).standard_normal(d)
    return g.mean(axis=1) + (g @ xi) / math.sqrt(b * d)


def isotropic_noise(K: int, sigma2: float, rng: np.random.Generator) -> np.ndarray:
    """``N(0, sigma2 I_K)``: the per-user noise of Table 1's isotropic rows (SGD-DP, GD-DP).

    Parameters
    ----------
    K : int
        Model dimension.
    sigma2 : float
        Variance per coordinate (>= 0).
    rng : np.random.Generator
        Source of the noise.

    Examples
    --------
    >>> n = isotropic_noise(200_000, 4.0, np.random.default_rng(0))
    >>> n.shape, round(float(n.var()), 1)
    ((200000,), 4.0)
    """
    if isinstance(K, bool):
        raise InvalidArgumentError("K", f"expected an integer >= 1, got {K!r}")
    try:
        k = operator.index(K)
    except TypeError:
        raise InvalidArgumentError("K", f"expected an integer >= 1, got {K!r}") from None
    if k < 1:
        raise InvalidArgumentError("K", f"expected an integer >= 1, got {k}")
    s2 = _nonnegative(sigma2, "sigma2")
    return math.sqrt(s2) * _generator(rng).standard_normal(k)
