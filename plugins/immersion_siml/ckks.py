"""A CKKS homomorphic-encryption baseline (TenSEAL) for training seed 002's ``nn-x2`` network.

The network is d-16-10 with the square activation: ``a = x W1 + b1``, ``h = a**2``,
``z = h W2 + b2``. Full encrypted training over many epochs is out of reach on a small CPU, so
:func:`measure_ckks_training` runs **one encrypted training step per sample** (forward *and*
backward, giving every weight gradient) on a few samples, times it, validates the decrypted
gradients against float64 numpy, and **extrapolates** the mean per-sample time to one epoch over
the training set (``extrapolated_epoch_s = per_sample_s * n_train``; flagged ``extrapolated``).

Setting (the honest, CKKS-friendly variant)
-------------------------------------------
* The data owner holds the CKKS secret key and encrypts each sample ``x`` and its one-hot label
  ``y``. The server holds the weights ``W1`` (d x 16), ``b1``, ``W2`` (16 x 10), ``b2`` **in
  plaintext**. This is optimistic for CKKS: an encrypted model would need ciphertext-ciphertext
  products everywhere and more depth.
* Loss: ``0.5 * ||z - y||**2`` (MSE on the one-hot label), because softmax cross-entropy is not a
  polynomial and cannot be evaluated exactly under CKKS. So ``dz = z - y``.
* On ciphertexts the server computes the forward pass and ``gW2 = outer(h, dz)``, ``gb2 = dz``,
  ``dh = dz W2^T``, ``da = 2 a * dh``, ``gW1 = outer(x, da)``, ``gb1 = da``. The data owner
  decrypts the gradient (or returns it to the server in an interactive round); the plaintext SGD
  update itself is negligible and not timed. The measured samples all use the initial weights.
* Both parties are simulated in one process with one TenSEAL context; the server side uses only
  the public, relinearisation and Galois keys. The server encrypts its own bias ``b2`` under the
  public key (see the packing note), which is timed as server compute.

Packing
-------
Every value lives in ``CKKSVector`` ciphertexts of ``S = poly_modulus_degree / 2 = 8192`` slots.
The data owner encrypts ``x`` (augmented with a constant 1 so that ``b1`` becomes a last row of
``W1``) in a replicated layout, slot ``16 i + j`` holding ``x_i``, 511 rows per ciphertext (two
ciphertexts for d = 784). One plaintext product with ``W1`` laid out the same way followed by a
stride-16 rotation sum (TenSEAL's ``enc_matmul_plain`` with a vector of ones: log2(512) = 9
power-of-two rotations) yields ``a`` replicated with period 16 in all slots; this avoids the
diagonal method's d rotations of ``x.mm(W1)`` (measured: 3.8 s for d = 64 and 100 s for d = 784 on
two cores). ``W2`` products use ``CKKSVector.mm`` (diagonal method, one rotation per input row). The
outer products need no extra rotations: a period-16 vector already *is* ``da`` tiled, so
``gW1 = x_rep * da`` is one ciphertext product per ``x`` ciphertext (its augmented row is ``gb1``),
and ``gW2^T`` (slot ``16 k + j``) is ``h`` tiled times ``dz`` repeated 16 times (one ``mm`` with a
0/1 matrix, 10 rotations). Single-diagonal 0/1 ``mm`` calls (no rotation, one level) only change
TenSEAL's logical vector size, which element-wise products require to match. Biases must be
replicated in every slot because later ``mm`` calls read past the first slots; a plaintext
``add`` of a short vector would zero-pad and silently corrupt the next product, hence the
encrypted ``b2``. The hidden width is padded to a power of two (zero weights) for these
layouts. About 45 rotations per step, independent of d.

CKKS parameters
---------------
Multiplicative depth 7: ``x W1`` (1), rotation sum (2), square (3), ``h W2`` (4), ``dz W2^T`` (5),
``a * dh`` (6), ``x * da`` (7). Hence ``poly_modulus_degree = 16384`` with
``coeff_mod_bit_sizes = [60, 40 x 7, 60]`` (400 bits, within SEAL's 438-bit bound for 128-bit
security) and global scale ``2**40``. Galois keys are TenSEAL's default set (power-of-two
steps); key generation is a one-off ``setup_s`` outside the per-sample time. Decrypted
gradients match float64 to a relative error of a few 1e-5.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from immersion import InvalidArgumentError

POLY_MODULUS_DEGREE = 16384
COEFF_MOD_BIT_SIZES = (60, 40, 40, 40, 40, 40, 40, 40, 60)
GLOBAL_SCALE_BITS = 40
_SLOTS = POLY_MODULUS_DEGREE // 2


def tenseal_available() -> bool:
    """Whether TenSEAL (the ``baselines`` extra) can be imported.

    Returns
    -------
    bool
        True when ``import tenseal`` succeeds.
    """
    try:
        _tenseal()
    except ImportError:
        return False
    return True


def _tenseal() -> Any:
    try:
        import tenseal
    except ImportError:
        from immersion import OptionalDependencyError

        raise OptionalDependencyError("tenseal", "baselines", "the CKKS baseline") from None
    return tenseal


def count_parameters(d: int, hidden: int = 16, n_classes: int = 10) -> int:
    """Number of parameters of the d-hidden-n_classes network (weights and biases).

    Parameters
    ----------
    d:
        Input dimension.
    hidden:
        Hidden width.
    n_classes:
        Number of outputs.

    Returns
    -------
    int
        ``d * hidden + hidden + hidden * n_classes + n_classes``.

    Examples
    --------
    >>> count_parameters(64)
    1210
    >>> count_parameters(784)
    12730
    """
    return d * hidden + hidden + hidden * n_classes + n_classes


def init_weights(
    d: int, hidden: int = 16, n_classes: int = 10, seed: int = 0
) -> dict[str, np.ndarray]:
    """Small random weights, every entry drawn from N(0, 0.1**2).

    Parameters
    ----------
    d, hidden, n_classes:
        Layer sizes.
    seed:
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    dict
        ``W1`` (d, hidden), ``b1`` (hidden,), ``W2`` (hidden, n_classes), ``b2`` (n_classes,).
    """
    rng = np.random.default_rng(seed)
    return {
        "W1": rng.normal(0.0, 0.1, (d, hidden)),
        "b1": rng.normal(0.0, 0.1, hidden),
        "W2": rng.normal(0.0, 0.1, (hidden, n_classes)),
        "b2": rng.normal(0.0, 0.1, n_classes),
    }


def plain_gradients(
    x: np.ndarray, y: np.ndarray, weights: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The reference step in float64: gradients of ``0.5 * ||z - y||**2`` for one sample.

    Parameters
    ----------
    x:
        One sample, shape (d,).
    y:
        Its one-hot label, shape (n_classes,).
    weights:
        ``W1``, ``b1``, ``W2``, ``b2`` as returned by :func:`init_weights`.

    Returns
    -------
    dict
        ``W1``, ``b1``, ``W2``, ``b2``: the gradients, shaped like the weights.

    Examples
    --------
    >>> w = {"W1": np.array([[1.0], [2.0]]), "b1": np.array([0.5]),
    ...      "W2": np.array([[1.0, -1.0]]), "b2": np.array([0.0, 0.0])}
    >>> g = plain_gradients(np.array([1.0, 0.0]), np.array([1.0, 0.0]), w)
    >>> g["b2"]  # a = 1.5, h = 2.25, z = (2.25, -2.25), dz = z - y
    array([ 1.25, -2.25])
    >>> g["b1"]  # 2 a (dz W2^T) = 3 * 3.5
    array([10.5])
    >>> g["W1"]
    array([[10.5],
           [ 0. ]])
    """
    a = x @ weights["W1"] + weights["b1"]
    h = a * a
    dz = h @ weights["W2"] + weights["b2"] - y
    da = 2.0 * a * (dz @ weights["W2"].T)
    return {"W1": np.outer(x, da), "b1": da, "W2": np.outer(h, dz), "b2": dz}


@dataclass(frozen=True)
class CkksMeasurement:
    """Timing of one encrypted training step per sample, extrapolated to an epoch.

    Attributes
    ----------
    n_measured:
        Samples run under encryption.
    n_train:
        Training-set size N used for the extrapolation.
    per_sample_s:
        Mean wall time per sample of encrypt + encrypted forward/backward + decrypt.
    encrypt_s, compute_s, decrypt_s:
        The three parts of ``per_sample_s`` (means over the measured samples).
    extrapolated_epoch_s:
        ``per_sample_s * n_train`` (an extrapolation, not a measured epoch).
    plain_per_sample_s:
        The same forward/backward on one plaintext sample in float64 numpy.
    gradient_max_rel_error:
        Over samples and the four gradients, ``max |decrypted - float64| / max |float64|``.
    poly_modulus_degree:
        CKKS ring degree.
    parameters:
        Model parameters, ``d*hidden + hidden + hidden*n_classes + n_classes``.
    extrapolated:
        Always True: the epoch time is extrapolated from ``n_measured`` samples.
    setup_s:
        One-off context and key generation (not part of ``per_sample_s``).
    coeff_mod_bit_sizes, global_scale_bits:
        The rest of the CKKS parameters.
    upload_bytes, download_bytes:
        Serialized size of one encrypted sample and of one encrypted gradient.
    n_threads:
        Threads TenSEAL used.
    """

    n_measured: int
    n_train: int
    per_sample_s: float
    encrypt_s: float
    compute_s: float
    decrypt_s: float
    extrapolated_epoch_s: float
    plain_per_sample_s: float
    gradient_max_rel_error: float
    poly_modulus_degree: int
    parameters: int
    extrapolated: bool = True
    setup_s: float = 0.0
    coeff_mod_bit_sizes: tuple[int, ...] = COEFF_MOD_BIT_SIZES
    global_scale_bits: int = GLOBAL_SCALE_BITS
    upload_bytes: int = 0
    download_bytes: int = 0
    n_threads: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict."""
        out = asdict(self)
        out["coeff_mod_bit_sizes"] = list(self.coeff_mod_bit_sizes)
        return out


class _Packing:
    """Slot layouts and the weight-independent 0/1 matrices for one network shape."""

    def __init__(self, ts: Any, d: int, hidden: int, n_classes: int) -> None:
        self.d, self.hidden, self.n_classes = d, hidden, n_classes
        self.width = 1 << (hidden - 1).bit_length()  # hidden padded to a power of two
        self.blocks = _SLOTS // self.width  # rows per ciphertext incl. padding
        self.rows = self.blocks - 1  # last row left zero: the top slots of dh are not replicated
        self.n_ct = -(-(d + 1) // self.rows)
        w, c = self.width, n_classes
        self.tile_all = ts.plain_tensor(np.tile(np.eye(w), (1, self.blocks)))  # size w -> S
        self.tile_h = ts.plain_tensor(np.tile(np.eye(w), (1, c)))  # size w -> c*w
        self.repeat_dz = ts.plain_tensor(np.kron(np.eye(c), np.ones((1, w))))  # slot k*w+j = dz_k
        self.ones = [1.0] * self.blocks

    def rows_layout(self, m: np.ndarray) -> list[np.ndarray]:
        """Split (d+1, w) rows into per-ciphertext flat slot vectors (zero-padded)."""
        out = []
        for c in range(self.n_ct):
            blk = np.zeros((self.blocks, self.width))
            part = m[c * self.rows : (c + 1) * self.rows]
            blk[: len(part)] = part
            out.append(blk.ravel())
        return out


def _make_context(ts: Any) -> Any:
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=POLY_MODULUS_DEGREE,
        coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES),
    )
    ctx.global_scale = 2.0**GLOBAL_SCALE_BITS
    ctx.generate_galois_keys()
    return ctx


def _encrypt_sample(
    ts: Any, ctx: Any, p: _Packing, x: np.ndarray, y: np.ndarray
) -> tuple[list[Any], Any]:
    """Data owner: ``x`` (augmented with 1) replicated as slot w*i + j = x_i; ``y`` as is."""
    xa = np.append(x, 1.0)
    rep = np.repeat(xa[:, None], p.width, axis=1)
    return [ts.ckks_vector(ctx, v.tolist()) for v in p.rows_layout(rep)], ts.ckks_vector(
        ctx, y.tolist()
    )


def _encrypted_step(
    ts: Any, ctx: Any, p: _Packing, x_cts: list[Any], y_ct: Any, weights: dict[str, np.ndarray]
) -> tuple[list[Any], Any, Any]:
    """Server: forward and backward on ciphertexts; returns (gW1|gb1 cts, gW2^T ct, gb2 ct)."""
    w, c = p.width, p.n_classes
    w1 = np.zeros((p.d + 1, w))
    w1[: p.d, : p.hidden] = weights["W1"]
    w1[p.d, : p.hidden] = weights["b1"]
    w2 = np.zeros((w, c))
    w2[: p.hidden] = weights["W2"]
    # Levels consumed so far in the right-hand comments (7 available).
    terms = [ct.mul(wv.tolist()) for ct, wv in zip(x_cts, p.rows_layout(w1), strict=True)]
    acc = terms[0]  # x_i W1[i, j]            1
    for term in terms[1:]:
        acc = acc.add(term)
    a = acc.enc_matmul_plain(p.ones, w)  # sum over i: a, period w 2
    h = a.square()  # 3
    z = h.mm(w2).add(ts.ckks_vector(ctx, weights["b2"].tolist()))  # 4 (encrypted, replicated b2)
    dz = z.sub(y_ct)  # 4
    dh2 = dz.mm(np.tile(2.0 * w2.T, (1, p.blocks)))  # 2 dz W2^T, size S       5
    da = a.mm(p.tile_all).mul(dh2)  # 2 a dh                  6
    g1 = [ct.mul(da) for ct in x_cts]  # outer(x|1, da)          7
    g2t = h.mm(p.tile_h).mul(dz.mm(p.repeat_dz))  # slot k*w+j = h_j dz_k   5
    return g1, g2t, dz


def _decrypt_gradients(p: _Packing, g1: list[Any], g2t: Any, gb2: Any) -> dict[str, np.ndarray]:
    rows = np.vstack([np.asarray(g.decrypt()).reshape(p.blocks, p.width)[: p.rows] for g in g1])
    gw2 = np.asarray(g2t.decrypt()).reshape(p.n_classes, p.width).T
    return {
        "W1": rows[: p.d, : p.hidden],
        "b1": rows[p.d, : p.hidden],
        "W2": gw2[: p.hidden],
        "b2": np.asarray(gb2.decrypt()),
    }


def _plain_time(x: np.ndarray, y: np.ndarray, weights: dict[str, np.ndarray]) -> float:
    loops = 200
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(loops):
            plain_gradients(x, y, weights)
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


def _check(
    x_train: Any, y_train: Any, hidden: int, n_classes: int, n_samples: int
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x_train, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise InvalidArgumentError(
            "x_train", f"expected a non-empty (N, d) array, got shape {x.shape}"
        )
    if not np.all(np.isfinite(x)):
        raise InvalidArgumentError("x_train", "contains NaN or inf")
    y = np.asarray(y_train)
    if y.shape != (x.shape[0],):
        raise InvalidArgumentError(
            "y_train", f"expected shape ({x.shape[0]},) to match x_train, got {y.shape}"
        )
    if not isinstance(hidden, int | np.integer) or hidden < 1:
        raise InvalidArgumentError("hidden", f"expected a positive integer, got {hidden!r}")
    width = 1 << (hidden - 1).bit_length()
    if width > _SLOTS // 2:
        raise InvalidArgumentError(
            "hidden", f"at most {_SLOTS // 2} fits the packing, got {hidden}"
        )
    if not isinstance(n_classes, int | np.integer) or n_classes < 2 or n_classes * width > _SLOTS:
        raise InvalidArgumentError(
            "n_classes", f"expected 2 <= n_classes <= {_SLOTS // width}, got {n_classes!r}"
        )
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_classes:
        raise InvalidArgumentError("y_train", f"expected integer labels in [0, {n_classes})")
    if not isinstance(n_samples, int | np.integer) or not 1 <= n_samples <= x.shape[0]:
        raise InvalidArgumentError(
            "n_samples", f"expected 1 <= n_samples <= {x.shape[0]}, got {n_samples!r}"
        )
    return x, y


def measure_ckks_training(
    x_train: Any,
    y_train: Any,
    *,
    hidden: int = 16,
    n_classes: int = 10,
    n_samples: int = 4,
    seed: int = 0,
) -> CkksMeasurement:
    """Time one CKKS-encrypted training step per sample and extrapolate to one epoch.

    Parameters
    ----------
    x_train:
        Training inputs, shape (N, d), values in [0, 1].
    y_train:
        Integer labels in ``[0, n_classes)``, shape (N,).
    hidden:
        Hidden width (16 for ``nn-x2``).
    n_classes:
        Number of classes (10).
    n_samples:
        How many samples (drawn without replacement with ``seed``) to run under encryption.
    seed:
        Seeds the weights (N(0, 0.1**2)) and the sample choice.

    Returns
    -------
    CkksMeasurement
        Mean per-sample times, the extrapolated epoch time, the plaintext time, the gradient error.

    Raises
    ------
    immersion.OptionalDependencyError
        TenSEAL (extra ``baselines``) is not installed.
    immersion.InvalidArgumentError
        Shapes disagree, labels are out of range, or ``hidden``/``n_classes``/``n_samples`` are
        out of range.
    """
    x, y = _check(x_train, y_train, hidden, n_classes, n_samples)
    ts = _tenseal()
    n, d = x.shape
    weights = init_weights(d, hidden, n_classes, seed)
    chosen = np.random.default_rng(seed).choice(n, size=n_samples, replace=False)
    onehot = np.eye(n_classes)[y[chosen]]

    t0 = time.perf_counter()
    ctx = _make_context(ts)
    pack = _Packing(ts, d, hidden, n_classes)
    setup_s = time.perf_counter() - t0

    enc_t, comp_t, dec_t, err = [], [], [], 0.0
    upload = download = 0
    for k, idx in enumerate(chosen):
        t0 = time.perf_counter()
        x_cts, y_ct = _encrypt_sample(ts, ctx, pack, x[idx], onehot[k])
        t1 = time.perf_counter()
        g1, g2t, gb2 = _encrypted_step(ts, ctx, pack, x_cts, y_ct, weights)
        t2 = time.perf_counter()
        grads = _decrypt_gradients(pack, g1, g2t, gb2)
        t3 = time.perf_counter()
        enc_t.append(t1 - t0)
        comp_t.append(t2 - t1)
        dec_t.append(t3 - t2)
        ref = plain_gradients(x[idx], onehot[k], weights)
        for name, r in ref.items():
            scale = max(float(np.max(np.abs(r))), np.finfo(float).tiny)
            err = max(err, float(np.max(np.abs(grads[name] - r))) / scale)
        if k == 0:
            upload = sum(len(ct.serialize()) for ct in [*x_cts, y_ct])
            download = sum(len(ct.serialize()) for ct in [*g1, g2t, gb2])

    encrypt_s, compute_s, decrypt_s = (float(np.mean(t)) for t in (enc_t, comp_t, dec_t))
    per_sample = encrypt_s + compute_s + decrypt_s
    return CkksMeasurement(
        n_measured=n_samples,
        n_train=n,
        per_sample_s=per_sample,
        encrypt_s=encrypt_s,
        compute_s=compute_s,
        decrypt_s=decrypt_s,
        extrapolated_epoch_s=per_sample * n,
        plain_per_sample_s=_plain_time(x[chosen[0]], onehot[0], weights),
        gradient_max_rel_error=err,
        poly_modulus_degree=POLY_MODULUS_DEGREE,
        parameters=count_parameters(d, hidden, n_classes),
        setup_s=setup_s,
        upload_bytes=upload,
        download_bytes=download,
        n_threads=os.cpu_count() or 1,
    )
