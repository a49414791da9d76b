"""The user's secret keys (seed 002, Proposition 1): ``Pi1..Pi4``, ``N1``, left inverses, noise
law."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from ..errors import InvalidArgumentError
from .arrays import key_arrays
from .codes import Code, DenseCode, DenseMask, StructuredCode, StructuredMask, row_norms
from .stats import RowStats
from .structured import draw_structured_layout
from .views import KeyViews

NoiseKind = Literal["laplace", "gaussian"]
Mask = DenseMask | StructuredMask


@dataclass(frozen=True)
class NoiseLaw:
    """The law of ``s_k`` and the data bounds it was designed for (seed 002 Theorem 1, seed 000
    Theorem 2).

    ``scale`` is the Laplace scale b (or the Gaussian standard deviation) and ``mean`` the mean
    ``mu`` of every entry of ``s_k``. Sensitivities are L1 for Laplace and L2 for Gaussian;
    deltas are 0 for Laplace.

    Parameters
    ----------
    kind:
        ``"laplace"`` or ``"gaussian"``.
    scale:
        The Laplace scale b, or the Gaussian standard deviation (> 0).
    mean:
        The mean ``mu`` of every entry of ``s_k``.
    sensitivity_input, sensitivity_output:
        The bounds of y and u the law was designed for (> 0).
    delta_input, delta_output:
        The deltas of the Gaussian design (0 for Laplace).
    """

    kind: NoiseKind
    scale: float
    mean: float = 0.0
    sensitivity_input: float = 1.0
    sensitivity_output: float = 1.0
    delta_input: float = 0.0
    delta_output: float = 0.0

    def __post_init__(self) -> None:
        """Refuse a law no theorem covers (named as :meth:`Keys.from_matrices` names them)."""
        from ..validation import as_float

        if not isinstance(self.kind, str) or self.kind not in ("laplace", "gaussian"):
            raise InvalidArgumentError(
                "noise", f"expected 'laplace' or 'gaussian', got {self.kind!r}"
            )
        for name, value, low in (
            ("noise_scale", self.scale, "positive"),
            ("noise_mean", self.mean, None),
            ("sensitivity_input", self.sensitivity_input, "positive"),
            ("sensitivity_output", self.sensitivity_output, "positive"),
            ("delta_input", self.delta_input, "probability"),
            ("delta_output", self.delta_output, "probability"),
        ):
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if (
                not number
                or not math.isfinite(as_float(value))
                or (low == "positive" and not value > 0)
                or (low == "probability" and not 0 <= value < 1)
            ):
                want = {"positive": "a finite number > 0", "probability": "a number in [0, 1)"}.get(
                    low or "", "a finite number"
                )
                raise InvalidArgumentError(name, f"expected {want}, got {value!r}")


def draw_structured_code(
    n: int, extra: int, *, block_size: int, rng: np.random.Generator
) -> StructuredCode:
    """One code ``y -> Pi y + N s`` (n -> n + extra) with block size ``block_size``.

    ``block_size >= n + extra`` gives a single dense block (densify it with :func:`densified`).
    """
    params, sig, noise, flat = draw_structured_layout(rng, n, extra, block_size)
    scale = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
    return StructuredCode(params, sig, noise, flat, scale)


def densified(code: Code) -> DenseCode:
    """``code`` with its matrices materialised (fast for small sizes)."""
    if isinstance(code, DenseCode):
        return code
    return DenseCode(code.dense_pi(), code.dense_pi_left(), code.dense_noise_basis())


def draw_code(
    n: int,
    extra: int,
    *,
    kind: Literal["dense", "block"] = "block",
    block_size: int = 32,
    rng: Any = None,
) -> Code:
    """A single code, e.g. for a model vector in federated learning (seed 000: ``Pi1, Pi1_left,
    N1``).

    Examples
    --------
    >>> code = draw_code(10, 3, kind="dense", rng=0)
    >>> code.dense_pi().shape, bool(np.allclose(code.dense_pi_left() @ code.dense_noise_basis(), 0))
    ((13, 10), True)
    """
    from ..validation import one_of, positive_int, vector_fits

    n, extra, block_size = (
        positive_int("n", n),
        positive_int("extra", extra),
        positive_int("block_size", block_size),
    )
    kind = one_of("kind", kind, ("dense", "block"))  # type: ignore[assignment]
    size = n + extra
    vector_fits(
        "extra" if extra >= n else "n",
        max(n, extra),
        size * (size if kind == "dense" else min(block_size, size)),
        "the code's key matrices",
    )
    gen = np.random.default_rng(rng)
    code = draw_structured_code(
        n, extra, block_size=n + extra if kind == "dense" else block_size, rng=gen
    )
    return densified(code) if kind == "dense" else code


@dataclass(frozen=True, eq=False)
class Keys(KeyViews):
    """Secret keys of one immersion. Frozen; ``repr`` shows shapes and a fingerprint only.

    The dense views ``Pi1 .. Pi4``, ``N1``, ``Pi1_left .. Pi3_left`` are numpy arrays (for block
    keys they are materialised on demand and refused when too large).

    Parameters
    ----------
    input_code, state_code, output_code:
        The codes of y (``Pi1``, ``Pi1_left``, ``N1``), x (``Pi2``, ``Pi2_left``) and u
        (``Pi3``, ``Pi3_left``).
    mask:
        ``Pi4``, the input mask of the output (eq. 17).
    noise:
        The law of ``s_k``, or None before it is designed (:meth:`with_noise`).
    mask_is_generated:
        Whether ``Pi4`` was drawn (it then carries noise only) rather than given by the user.

    Examples
    --------
    >>> keys = Keys.draw(n_state=3, n_input=1, n_output=1, extra_state=1, extra_input=2,
    ...                  extra_output=2, rng=0)
    >>> keys.Pi1.shape, keys.N1.shape, keys.Pi4.shape
    ((3, 1), (3, 2), (3, 3))
    >>> bool(np.allclose(keys.Pi1_left @ keys.N1, 0))
    True
    """

    input_code: Code
    state_code: Code
    output_code: Code
    mask: Mask
    noise: NoiseLaw | None = None
    mask_is_generated: bool = True

    #: Float keys; :class:`immersion.keys.ModularKeys` has ``"modular"``.
    arithmetic = "float"

    # ------------------------------------------------------------------ construction
    @classmethod
    def draw(
        cls,
        *,
        n_state: int,
        n_input: int,
        n_output: int,
        extra_state: int = 1,
        extra_input: int = 2,
        extra_output: int = 2,
        kind: Literal["dense", "block"] = "dense",
        block_size: int = 32,
        rng: Any = None,
    ) -> "Keys":
        """Draw random keys (noise law not yet designed: ``noise_scale`` is None, mask scale 1).

        ``kind="dense"`` uses one Haar-random orthogonal matrix per code (O(n^2) memory);
        ``kind="block"`` the structured factors of :mod:`.structured` (O(n b)).

        Parameters
        ----------
        n_state, n_input, n_output:
            Dimensions of x, y and u.
        extra_state, extra_input, extra_output:
            Added dimensions (>= 1): the immersed sizes are ``n + extra``.
        kind:
            ``"dense"`` or ``"block"``.
        block_size:
            Block size of ``kind="block"`` keys.
        rng:
            Seed or Generator.
        """
        gen = np.random.default_rng(rng)
        size_of = {
            "input": (n_input, extra_input),
            "state": (n_state, extra_state),
            "output": (n_output, extra_output),
        }
        structured = {
            name: draw_structured_code(
                n, m, block_size=n + m if kind == "dense" else block_size, rng=gen
            )
            for name, (n, m) in size_of.items()
        }
        out_groups = structured["output"].flat_pos.shape[0]
        mask = StructuredMask(
            beta=1.0,
            signs=gen.choice([-1.0, 1.0], size=out_groups),
            source=np.arange(out_groups) % extra_input,
        )
        keys = cls(structured["input"], structured["state"], structured["output"], mask)
        return keys.densified() if kind == "dense" else keys

    def densified(self) -> "Keys":
        """The same keys with every code materialised as explicit matrices (fast for small
        sizes)."""
        return dataclasses.replace(
            self,
            input_code=densified(self.input_code),
            state_code=densified(self.state_code),
            output_code=densified(self.output_code),
            mask=DenseMask(self.Pi4),
        )

    @classmethod
    def from_matrices(
        cls,
        *,
        Pi1: Any,
        Pi2: Any,
        Pi3: Any,
        Pi4: Any,
        N1: Any = None,
        Pi1_left: Any = None,
        Pi2_left: Any = None,
        Pi3_left: Any = None,
        noise: NoiseKind = "laplace",
        noise_scale: float | None = None,
        noise_mean: float = 0.0,
        sensitivity_input: float = 1.0,
        sensitivity_output: float = 1.0,
        delta_input: float = 0.0,
        delta_output: float = 0.0,
    ) -> "Keys":
        """Keys from user matrices, validated (full column rank, left inverses, kernel basis).

        Missing left inverses default to the pseudo-inverse; a missing ``N1`` to an orthonormal
        basis of ``ker(Pi1_left)``. ``noise_scale=None`` lets :func:`immerse` design the noise
        from its epsilon targets; a given ``noise_scale`` is used as is, for data within the
        given sensitivities.

        Parameters
        ----------
        Pi1, Pi2, Pi3:
            Tall encoders of full column rank (y, x, u).
        Pi4:
            The input mask of the output, ``(n_output + extra_output, n_input + extra_input)``.
        N1:
            A basis of ``ker(Pi1_left)`` (None: an orthonormal one).
        Pi1_left, Pi2_left, Pi3_left:
            Left inverses (None: the pseudo-inverses).
        noise, noise_scale, noise_mean:
            The law of ``s_k`` (:class:`NoiseLaw`); ``noise_scale=None`` leaves it undesigned.
        sensitivity_input, sensitivity_output, delta_input, delta_output:
            The data bounds and deltas of a given ``noise_scale`` (:class:`NoiseLaw`).
        """
        from scipy.linalg import null_space

        def code(
            pi_name: str, pi: Any, left_name: str, left: Any, n_name: str | None, n: Any
        ) -> DenseCode:
            p = _matrix(pi_name, pi)
            if p.shape[0] <= p.shape[1]:
                raise InvalidArgumentError(
                    pi_name, f"must be tall (more rows than columns), got shape {p.shape}"
                )
            if np.linalg.matrix_rank(p) < p.shape[1]:
                raise InvalidArgumentError(
                    pi_name,
                    f"must have full column rank {p.shape[1]}, got rank {np.linalg.matrix_rank(p)}",
                )
            pl = (
                np.linalg.pinv(p)
                if left is None
                else _matrix(left_name, left, shape=(p.shape[1], p.shape[0]))
            )
            scale = max(1.0, np.abs(pl).max() * np.abs(p).max())
            if not np.allclose(pl @ p, np.eye(p.shape[1]), rtol=0.0, atol=1e-9 * scale):
                raise InvalidArgumentError(
                    left_name, f"is not a left inverse of {pi_name} ({left_name} @ {pi_name} != I)"
                )
            if n is None:
                basis = null_space(pl)
            else:
                basis = _matrix(n_name or "N", n, shape=(p.shape[0], p.shape[0] - p.shape[1]))
            return DenseCode(p, pl, basis)

        input_code = code("Pi1", Pi1, "Pi1_left", Pi1_left, "N1", N1)
        state_code = code("Pi2", Pi2, "Pi2_left", Pi2_left, None, None)
        output_code = code("Pi3", Pi3, "Pi3_left", Pi3_left, None, None)
        pi4 = _matrix("Pi4", Pi4, shape=(output_code.n_total, input_code.n_total))
        law = (
            None
            if noise_scale is None
            else NoiseLaw(
                noise,
                noise_scale,
                noise_mean,
                sensitivity_input,
                sensitivity_output,
                delta_input,
                delta_output,
            )
        )
        keys = cls(input_code, state_code, output_code, DenseMask(pi4), law, False)
        keys.validate()
        return keys

    def with_noise(self, law: NoiseLaw, *, mask_scale: float = 1.0) -> "Keys":
        """These keys with a designed noise law (and the generated mask rescaled by
        ``mask_scale``).

        Parameters
        ----------
        law:
            The noise law.
        mask_scale:
            Factor on ``Pi4`` (1: unchanged).
        """
        mask = self.mask
        if mask_scale != 1.0:
            mask = (
                DenseMask(mask.pi4 * mask_scale)
                if isinstance(mask, DenseMask)
                else dataclasses.replace(mask, beta=mask.beta * mask_scale)
            )
        return dataclasses.replace(self, mask=mask, noise=law)

    # ------------------------------------------------------------------ checks
    def validate(self, *, rtol: float = 1e-9) -> None:
        """Check the algebra Proposition 1 needs; raise :class:`InvalidArgumentError` naming the
        key.

        Full column rank of ``Pi1..Pi3``, ``PiL Pi = I``, ``Pi1_left N1 = 0``, no zero row in ``N1``
        and ``N1`` of full column rank. Dense keys are checked directly; block keys by their
        construction plus the row statistics (no dense view needed).

        Parameters
        ----------
        rtol:
            Relative tolerance of the zero tests.
        """
        stats = self.input_stats
        if np.any(stats.l2_noise <= rtol * max(stats.l2_noise.max(), 1e-300)):
            raise InvalidArgumentError(
                "N1", "has a zero row: that element of y~ would carry no noise"
            )
        if isinstance(self.input_code, DenseCode):
            n1, pl = self.input_code.noise_basis, self.input_code.pi_left
            if n1.shape[1] and np.linalg.matrix_rank(n1) < n1.shape[1]:
                raise InvalidArgumentError("N1", "must have full column rank")
            scale = np.abs(pl).max() * np.abs(n1).max() * pl.shape[1]
            if np.abs(pl @ n1).max() > rtol * max(scale, 1e-300):
                raise InvalidArgumentError(
                    "N1", "columns must lie in ker(Pi1_left): Pi1_left @ N1 != 0"
                )

    # ------------------------------------------------------------------ noise law
    @property
    def noise_kind(self) -> str:
        """``"laplace"`` or ``"gaussian"`` (``"undesigned"`` before a noise law is set)."""
        return self.noise.kind if self.noise else "undesigned"

    @property
    def noise_scale(self) -> float | None:
        """Laplace scale sigma (or Gaussian standard deviation) of every entry of ``s_k``."""
        return self.noise.scale if self.noise else None

    @property
    def noise_mean(self) -> float:
        """Mean ``mu`` of every entry of ``s_k``."""
        return self.noise.mean if self.noise else 0.0

    # ------------------------------------------------------------------ dense views
    @property
    def Pi4(self) -> np.ndarray:
        return self.mask.dense(self.input_code, self.output_code)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ statistics
    @cached_property
    def input_stats(self) -> RowStats:
        """Row norms of ``Pi1`` and ``N1`` (one entry per element of y~)."""
        return self.input_code.row_stats()

    @cached_property
    def output_stats(self) -> RowStats:
        """Row norms of ``Pi3`` (one entry per element of u~)."""
        return self.output_code.row_stats()

    @cached_property
    def mask_noise_row_norms(self) -> np.ndarray:
        """``||(Pi4 N1)^j||_2`` for every element j of u~."""
        return self.mask.noise_row_norms(
            self.input_code,  # type: ignore[arg-type]
            self.output_code,  # type: ignore[arg-type]
        )

    @cached_property
    def mask_noise_row_linf(self) -> np.ndarray:
        """``||(Pi4 N1)^j||_inf`` for every element j of u~."""
        return self.mask.noise_row_linf(self.input_code, self.output_code)  # type: ignore[arg-type]

    @cached_property
    def mask_row_norms(self) -> np.ndarray:
        """``||Pi4^j||_2`` for every element j of u~ (block keys: equal to
        :attr:`mask_noise_row_norms`,
        as ``N1`` has orthonormal columns and each row of ``Pi4`` has a single term)."""
        if isinstance(self.mask, DenseMask):
            return row_norms(self.mask.pi4)
        return self.mask_noise_row_norms

    @cached_property
    def mask_data_row_l1(self) -> np.ndarray:
        """``||(Pi4 Pi1)^j||_1`` (zero for generated keys: the mask carries noise only)."""
        return self.mask.data_row_l1(self.input_code, self.output_code)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ identity
    @property
    def nbytes(self) -> int:
        """Memory held by the keys."""
        return (
            self.input_code.nbytes
            + self.state_code.nbytes
            + self.output_code.nbytes
            + self.mask.nbytes
        )

    @cached_property
    def fingerprint(self) -> str:
        """First 16 hex digits of a SHA-256 over every key array and the noise law."""
        digest = hashlib.sha256()
        for name, arr in sorted(key_arrays(self).items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(arr).tobytes())
        digest.update(repr(self.noise).encode())
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"Keys(kind={self.kind!r}, y: {d['n_input']}->{d['n_input'] + d['extra_input']}, "
            f"x: {d['n_state']}->{d['n_state'] + d['extra_state']}, "
            f"u: {d['n_output']}->{d['n_output'] + d['extra_output']}, noise={self.noise_kind}, "
            f"fingerprint={self.fingerprint})"
        )

    __str__ = __repr__


def _matrix(name: str, value: Any, *, shape: tuple[int, int] | None = None) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgumentError(name, "expected a 2-D array of numbers") from None
    if arr.ndim != 2:
        raise InvalidArgumentError(name, f"expected a 2-D array, got shape {arr.shape}")
    if shape is not None and arr.shape != shape:
        raise InvalidArgumentError(name, f"expected shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(name, "contains NaN or inf")
    return arr
