"""Key rotation for ``immerse(f, g)``: fresh keys every ``rotate_keys_every`` samples (seed 002).

Why: under one key every encoded input ``y~_k = Pi1 y_k + N1 s_k`` (seed 002 eq. 16) has its noise
in the same subspace ``range(N1)``. An eavesdropper who collects many ``y~_k`` finds that subspace
by PCA and projects it out (what remains is a fixed linear image of ``y``), and one who knows
``n_input + extra_input`` pairs ``(y_k, y~_k)`` solves for a left inverse of ``Pi1`` that decodes
every later sample (``immersion audit --scheme immerse``; :mod:`immersion.audit.eavesdropper`).
Rotation bounds what one key ever encodes to ``k`` samples.

What a rotation does, every ``k`` samples:

* the user draws fresh keys with the same design (the same ``immerse`` options: dimensions,
  epsilons, sensitivities, noise law; the noise scale is designed again for the new keys, so
  each key meets the same per-element epsilon, seed 002 Theorem 1), and sends the cloud the new
  target (the public matrices of eq. 17, ``Pi1_left, Pi2, Pi2_left, Pi3, Pi4``: a
  :class:`KeyRotation`);
* **the cloud** moves its encoded state to the new key,
  ``x~_new = Pi2_new Pi2_old_left x~_old`` (:meth:`RotatingTarget.rekey`). It needs nothing it
  does not already hold (its old ``Pi2_left``, the new ``Pi2``) and learns nothing new: it
  computes ``x = Pi2_left x~`` in every step of eq. 17 anyway. The user never handles ``x~``.

Decoding stays exact across rotations (eq. 18 with the key of the sample being decoded:
``tests/test_audit_core.py`` checks a rotated closed loop against the plain one round by round).

What rotation does not do: it does nothing against the cloud (which decodes ``y`` and ``x``
under every key, THREAT_MODEL.md), and the rotation messages carry ``Pi1_left``, which decodes
``y~`` exactly: they must travel over a confidential channel, like the first target. Within one
key period the eavesdropper still runs the same attacks on ``k`` samples: the subspace attack
needs more samples than ``extra_input`` per key, the known-plaintext attack
``n_input + extra_input`` pairs per key (measured in the audit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..errors import InvalidArgumentError
from ..keys import Keys
from ..privacy import PrivacyReport
from .factory import Immersion, immerse
from .key_pool import DenseKeyPool
from .keygen import resolve_rng, split_rng
from .target import TargetAlgorithm


def public_target_bytes(keys: Keys) -> int:
    """Bytes of what one rotation sends the cloud: the public matrices of eq. 17.

    Dense keys: ``Pi1_left, Pi2, Pi2_left, Pi3, Pi4`` in float64 (what remote mode ships,
    without the ``.npz`` framing). Block keys: :attr:`Keys.nbytes`, an upper bound (the target
    carries the structured factors of the three codes and the mask).
    """
    if keys.kind != "dense":
        return int(keys.nbytes)
    return int(
        sum(getattr(keys, name).size for name in ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4")) * 8
    )


@dataclass(frozen=True, eq=False)
class KeyRotation:
    """The message of one rotation, from the user to the cloud.

    ``period`` numbers the new key (the first key is period 0); ``target`` is the cloud side
    of eq. 17 under the new keys; ``nbytes`` what it costs to send (:func:`public_target_bytes`).
    """

    period: int
    target: TargetAlgorithm
    nbytes: int


class RotatingTarget:
    """Cloud side under rotating keys: eq. 17 with the current target, and the state transition.

    ``advance``, ``step`` and ``output`` are those of
    :class:`~immersion.coding.target.TargetAlgorithm` for the current key period; :meth:`rekey`
    switches to the next key and moves the state.
    """

    def __init__(self, target: TargetAlgorithm) -> None:
        self.target = target
        self.period = 0

    def advance(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> tuple[Any, Any]:
        """``(u~, x~+)`` of one sample (eq. 17) under the current key."""
        return self.target.advance(encoded_state, encoded_input, w)

    def step(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """``x~+`` under the current key."""
        return self.target.step(encoded_state, encoded_input, w)

    def output(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """``u~`` under the current key."""
        return self.target.output(encoded_state, encoded_input, w)

    def rekey(self, rotation: KeyRotation, encoded_state: Any) -> Any:
        """Switch to ``rotation.target`` and return ``x~_new = Pi2_new Pi2_old_left x~_old``.

        Uses only the state codes the two targets hold (any backend, dense or block keys).
        """
        if not isinstance(rotation, KeyRotation):
            raise InvalidArgumentError(
                "rotation", f"expected a KeyRotation, got {type(rotation).__name__}"
            )
        if rotation.period != self.period + 1:
            raise InvalidArgumentError(
                "rotation",
                f"is for key period {rotation.period}, but the cloud is in period "
                f"{self.period}: apply every rotation once, in order",
            )
        old, new = self.target, rotation.target
        moved = old.reencode_state(encoded_state, new)
        self.target, self.period = new, rotation.period
        return moved


class RotatingImmersion:
    """User-side handle of ``immerse(f, g, ...)``, keys redrawn every ``rotate_keys_every`` samples.

    Parameters
    ----------
    f, g, n_state, n_input, n_output:
        As for :func:`immersion.immerse` (seed 002 eqs. 16-18).
    rotate_keys_every:
        ``k >= 1``: samples encoded under one key. Each key period draws fresh keys with the same
        design. Against the eavesdropper of the audit, ``k <= extra_input`` leaves the subspace
        attack no noise subspace to find, and ``k < n_input + extra_input`` leaves the
        known-plaintext attack too few pairs per key; larger ``k`` only bounds what one key exposes.
    rng, secure:
        Seed or Generator from which every key period's keys and noise are spawned
        (``secure=True``: 256 bits of OS entropy). The first period draws from a child stream,
        so its keys are not those of ``immerse(..., rng=<same seed>)``; the later periods of
        small dense keys on numpy float64 come from one more child stream, drawn ahead in
        batches (:mod:`immersion.coding.key_pool`), the later periods of other keys from a child
        stream each.
    **options:
        Any other option of :func:`immersion.immerse` (``extra_input``, ``epsilon_input``,
        ``noise``, ``keys="dense"``, ``backend``, ...); every period uses the same options. A fixed
        :class:`~immersion.keys.Keys` object is refused: rotation draws keys.

    Attributes
    ----------
    current:
        The :class:`~immersion.coding.handle.Immersion` of the current key period.
    cloud:
        An in-process :class:`RotatingTarget` (a remote cloud applies the same
        :class:`KeyRotation` messages).
    period:
        Number of rotations so far.

    Notes
    -----
    One closed-loop sample is ``encode_input`` -> cloud ``advance`` -> ``decode_output`` ->
    :meth:`tick`; ``tick`` returns a :class:`KeyRotation` after every ``k``-th sample, which the
    cloud applies to its state with :meth:`RotatingTarget.rekey` before the next sample.
    :meth:`step` does all of this with :attr:`cloud`. Samples are counted by ``tick``, not by
    cloud iterations (two time scales, seed 002 Corollary 1, are unaffected).

    Cost: the first period is one ``immerse`` call (probes of ``f`` and ``g``, key draw, noise
    design, precision check). Later periods reuse the checked ``f``, ``g`` and probe-point gain;
    small dense keys on numpy float64 are drawn many periods at a time, vectorised
    (:class:`~immersion.coding.key_pool.DenseKeyPool`: same construction, same noise design and
    precision check per period), other keys one ``immerse``-like draw per period. On the wire a
    rotation costs :func:`public_target_bytes`; ``immersion audit --scheme immerse`` measures
    both, ``benchmarks/bench_control_loop.py`` the step time against a single key.

    Examples
    --------
    >>> import numpy as np
    >>> f = lambda x, y: 0.5 * x + y
    >>> g = lambda x, y: 2.0 * x + y
    >>> rot = RotatingImmersion(f, g, n_state=1, n_input=1, n_output=1, rotate_keys_every=3, rng=0)
    >>> first = rot.keys.fingerprint
    >>> x, xt = np.zeros(1), rot.encode_state(np.zeros(1))
    >>> for k in range(10):
    ...     y = np.array([np.sin(k)])
    ...     u, xt = rot.step(y, xt)
    ...     assert abs(u[0] - g(x, y)[0]) < 1e-9
    ...     x = f(x, y)
    >>> rot.period, rot.keys.fingerprint != first
    (3, True)
    >>> bool(np.allclose(rot.decode_state(xt), x, rtol=0, atol=1e-9))
    True
    """

    def __init__(
        self,
        f: Callable[..., Any],
        g: Callable[..., Any],
        n_state: int,
        n_input: int,
        n_output: int,
        *,
        rotate_keys_every: int,
        rng: int | np.random.Generator | np.random.SeedSequence | None = None,
        secure: bool = False,
        **options: Any,
    ) -> None:
        self.rotate_keys_every = v.positive_int("rotate_keys_every", rotate_keys_every)
        if isinstance(options.get("keys"), Keys):
            raise InvalidArgumentError(
                "keys",
                "key rotation draws fresh keys every period; pass 'auto', 'dense' or "
                "'block', not a Keys object",
            )
        for name in ("rng", "secure"):
            options.pop(name, None)
        self._args: tuple[Any, ...] = (f, g, n_state, n_input, n_output)
        self._options = options
        self._rng = resolve_rng(rng, secure)
        self.current: Immersion = immerse(*self._args, rng=self._rng.spawn(1)[0], **options)
        self.cloud = RotatingTarget(self.current.target)
        self.period = 0
        self._samples = 0
        #: how immerse designed the first period (None: modular arithmetic, redrawn by immerse)
        self._design = self.current._design
        be = self.current.backend
        pooled = self.current.keys.kind == "dense" and (be.name, be.dtype_name) == (
            "numpy",
            "float64",
        )
        self._pool: DenseKeyPool | None = None
        self._pooled = self._design is not None and pooled
        self._nbytes = public_target_bytes(self.current.keys) if self._pooled else None

    def _draw(self) -> Immersion:
        """The next period's handle: from the key pool (small dense keys on numpy float64), else
        drawn as ``immerse`` draws them, without probing ``f`` and ``g`` again."""
        if self._pooled:
            if self._pool is None:
                design = self._design
                self._pool = DenseKeyPool(design, self._rng.spawn(1)[0])  # type: ignore[arg-type]
            return self._pool.take()
        child = self._rng.spawn(1)[0]
        if self._design is None:
            return immerse(*self._args, rng=child, **self._options)
        key_rng, noise_rng = split_rng(child, False)
        return self._design.immerse(None, key_rng, noise_rng)

    # ------------------------------------------------------------------ the current key period
    @property
    def keys(self) -> Keys:
        """Keys of the current period."""
        return self.current.keys

    @property
    def target(self) -> TargetAlgorithm:
        """Cloud side of the current period (what the last :class:`KeyRotation` carried)."""
        return self.current.target

    def encode_state(self, state: Any) -> Any:
        """``x~ = Pi2 x`` under the current key."""
        return self.current.encode_state(state)

    def encode_input(self, y: Any) -> Any:
        """``y~ = Pi1 y + N1 s`` under the current key (eq. 16)."""
        return self.current.encode_input(y)

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> Any:
        """``u = Pi3_left (u~ - Pi4 y~)`` (eq. 18); call it before :meth:`tick` ends the period."""
        return self.current.decode_output(encoded_output, encoded_input)

    def decode_state(self, encoded_state: Any) -> Any:
        """``x = Pi2_left x~`` under the current key."""
        return self.current.decode_state(encoded_state)

    def report(self) -> PrivacyReport:
        """Privacy and precision report of the current keys (each period meets the same targets)."""
        return self.current.report()

    # ------------------------------------------------------------------ rotation
    def tick(self) -> KeyRotation | None:
        """Count one sample; every ``rotate_keys_every``-th draws fresh keys, returns the message.

        The returned :class:`KeyRotation` must reach the cloud (``cloud.rekey(rotation, x~)``)
        before the next sample is encoded.
        """
        self._samples += 1
        if self._samples % self.rotate_keys_every:
            return None
        self.current = current = self._draw()
        self.period += 1
        nbytes = self._nbytes or public_target_bytes(current.keys)
        return KeyRotation(self.period, current.target, nbytes)

    def step(self, y: Any, encoded_state: Any, w: Any = None) -> tuple[Any, Any]:
        """One closed-loop sample with the in-process :attr:`cloud`: ``(u, next x~)``.

        Encodes ``y``, runs eq. 17 in the cloud, decodes ``u`` (eq. 18), then rotates if due
        (the cloud moves ``x~`` to the new key).
        """
        current = self.current
        yt = current.encode_input(y)
        ut, xt = self.cloud.target.advance(encoded_state, yt, w)
        u = current.decode_output(ut, yt)
        rotation = self.tick()
        if rotation is not None:
            xt = self.cloud.rekey(rotation, xt)
        return u, xt

    def __repr__(self) -> str:
        return (
            f"RotatingImmersion(rotate_keys_every={self.rotate_keys_every}, "
            f"period={self.period}, {self.current.keys!r})"
        )


__all__ = ["RotatingImmersion", "RotatingTarget", "KeyRotation", "public_target_bytes"]
