"""Random streams and key geometry (seed 002, Proposition 1): where keys are drawn from.

:func:`split_rng` gives the two independent streams of an immersion (keys, encoding noise);
:func:`draw_geometry` draws validated keys of given dimensions and kind. The design those keys
follow, and its noise law, is :class:`~immersion.coding.design.Design`.
"""

from __future__ import annotations

import secrets
import warnings
from typing import Any

import numpy as np

from .. import validation as v
from ..errors import ImmersionSecurityWarning, InvalidArgumentError
from ..keys import Keys

#: Largest immersed dimension for which ``keys="auto"`` draws dense keys (block keys are faster
#: above: measured 5.7x at n = 1000).
AUTO_DENSE_LIMIT = 512
#: Default block size of float block keys.
FLOAT_BLOCK_SIZE = 32


def resolve_rng(rng: Any, secure: bool) -> np.random.Generator:
    """A numpy Generator from ``rng`` (seed, Generator or None), or from OS entropy if
    ``secure``."""
    if not isinstance(secure, (bool, np.bool_)):
        raise InvalidArgumentError("secure", f"expected True or False, got {secure!r}")
    if secure:
        if rng is not None:
            raise InvalidArgumentError("rng", "pass either rng or secure=True, not both")
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(secrets.randbits(256))))
    if isinstance(rng, (bool, np.bool_)):
        raise InvalidArgumentError(
            "rng", f"expected None, an int seed or a numpy Generator, got {rng!r}"
        )
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        if isinstance(rng, (int, np.integer)) and rng < 0:
            raise InvalidArgumentError("rng", f"expected a non-negative seed, got {rng}")
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise InvalidArgumentError(
        "rng", f"expected None, an int seed or a numpy Generator, got {type(rng).__name__}"
    )


#: Codings that already warned about a seeded key in this process.
_WARNED_SEEDED: set[str] = set()


def warn_seeded_key(rng: Any, coding: str) -> None:
    """Warn once per process and coding when a cryptographic key is derived from ``rng``.

    Parameters
    ----------
    rng:
        The user's ``rng`` argument (None: OS entropy, no warning).
    coding:
        The coding whose key it seeds (named in the message).
    """
    if rng is None or coding in _WARNED_SEEDED:
        return
    _WARNED_SEEDED.add(coding)
    warnings.warn(
        f"coding={coding!r} with a seeded rng: the secret key is derived from the seed, so "
        "anyone who guesses the seed decrypts everything. Seeds are for tests and reproducible "
        "benchmarks; leave rng out (OS entropy) or pass secure=True",
        ImmersionSecurityWarning,
        stacklevel=4,  # the caller of encrypt_controller
    )


def split_rng(rng: Any, secure: bool) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent streams for the keys and for the noise (same seed -> same keys everywhere)."""
    key_rng, noise_rng = resolve_rng(rng, secure).spawn(2)
    return key_rng, noise_rng


def draw_geometry(
    kind: Any,
    dims: dict[str, int],
    block_size: int,
    rng: np.random.Generator,
    *,
    arithmetic: str = "float",
) -> Any:
    """Draw and validate keys (float: no noise law yet); ``kind`` is ``"auto"``, ``"dense"`` or
    ``"block"``. ``arithmetic="modular"`` draws :class:`~immersion.keys.ModularKeys`.
    """
    from ..keys.modular import ModularKeys

    kind = v.one_of("keys", kind, ("auto", "dense", "block"))
    sizes = {n: dims[n] + dims["extra" + n[1:]] for n in ("n_state", "n_input", "n_output")}
    biggest = max(sizes, key=lambda n: sizes[n])
    size = sizes[biggest]
    if kind == "auto":
        kind = "dense" if size <= AUTO_DENSE_LIMIT else "block"
    entries = size * (size if kind == "dense" else min(block_size, size))
    # integer keys keep each block with its inverse (dense: K and K^-1 split in four matrices)
    modular = arithmetic == "modular"
    v.vector_fits(biggest, dims[biggest], 2 * entries if modular else entries, "the keys")
    try:
        keys = (ModularKeys if modular else Keys).draw(
            kind=kind,  # type: ignore[arg-type]
            block_size=block_size,
            rng=rng,
            **dims,
        )
    except MemoryError as exc:
        raise InvalidArgumentError(
            biggest, f"keys of these dimensions do not fit in memory ({exc})"
        ) from None
    keys.validate()
    return keys
