"""Options of the SIFL schemes (``sifl-m1``, ``sifl-m2``, ``sifl-rm``; seeds 000 and 003)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from immersion import InvalidArgumentError

from ..config import SchemeOptions, check_int, check_real, option

if TYPE_CHECKING:
    pass


NOISE_LAWS = ("laplace", "gaussian")
#: Dense SIFL keys above this many bytes are refused (block keys serve any size).
DENSE_KEY_BYTES = 2**30
KEY_KINDS = ("auto", "dense", "block")


@dataclass(frozen=True)
class SiflOptions(SchemeOptions):
    """Options of the SIFL schemes (``sifl-m1``, ``sifl-m2``, ``sifl-rm``; seeds 000 and 003).

    Parameters
    ----------
    extra:
        Added dimensions ``n~ - n`` (None: 201 for M1/M2 as in the paper's MLP, 1 for sifl-rm).
    p:
        Aggregator columns of SIFL M2 (>= 2).
    epsilon_local:
        Per-element epsilon of each upload (seed 000 Theorem 1 or 2).
    noise:
        ``"laplace"`` (Theorem 1) or ``"gaussian"`` (Theorem 2, with ``delta``).
    delta:
        Delta of the Gaussian design, in (0, 0.5).
    clip:
        Norm bound ``C`` of the clients' models (sensitivity ``2C/|D_i|``, Remark 3).
    keys:
        ``"auto"`` (dense up to 512 immersed entries), ``"dense"`` or ``"block"``.
    block_size:
        Block size of structured keys (transforms are memory-bound: smaller is faster).
    client_noise:
        Each client adds noise of its own in ``ker(Pi1_left)`` (:func:`kernel_noise`).
    arithmetic:
        ``"float"`` (seed 000's float64 coding) or ``"modular"``: fixed-point integers with integer
        keys and uniform noise modulo 2^64 (:mod:`immersion_fl.schemes.modular`): per-element
        epsilon 0 and decoding bit-identical to FedAvg on the same fixed-point values.
    fraction_bits:
        ``f`` of the fixed-point values ``round(w 2^f)`` (modular arithmetic).
    secure_aggregation:
        The aggregator receives pairwise-masked uploads and learns only their weighted sum
        (:mod:`immersion_fl.runtime.secure`, the core's :mod:`immersion.securesum.protocol`;
        dropouts recovered).

    Examples
    --------
    >>> SiflOptions(p=3).p
    3
    >>> SiflOptions.from_flags({"noise": "auto", "graph": "complete"}).noise
    'laplace'
    """

    extra: int | None = option(
        None,
        "added dimensions n~ - n (default: 201 for M1/M2 as in the paper's MLP, 1 for sifl-rm).",
        low=1,
    )
    p: int = option(2, "aggregator columns of sifl-m2.", low=2)
    epsilon_local: float = option(
        1.0, "per-element epsilon of each upload (seed 000 Theorem 1 or 2).", low=0, open_low=True
    )
    noise: str = option(
        "laplace",
        "laplace or gaussian (auto: laplace).",
        choices=("auto", *NOISE_LAWS),
        cli_default="auto",
    )
    delta: float = option(1e-5, "delta for --noise gaussian.", low=0, high=0.5, open_low=True)
    clip: float = option(
        100.0,
        "client model norm bound C (sensitivity 2C/|D_i|, seed 000 Remark 3; the paper uses 1000).",
        low=0,
        open_low=True,
    )
    keys: str = option(
        "auto",
        "key structure: dense, block (structured, see --block-size) or auto (dense up to 512 "
        "immersed entries, block above).",
        choices=KEY_KINDS,
    )
    block_size: int = option(
        8,
        "block size of structured keys (transforms are memory-bound: smaller is faster).",
        low=1,
    )
    client_noise: bool = False
    arithmetic: str = option(
        "float",
        "float64 coding (seed 000) or exact integers mod 2^64 (epsilon 0; decodes bit for bit to "
        "FedAvg on the same fixed-point values).",
        choices=("float", "modular"),
    )
    fraction_bits: int = option(
        32, "modular arithmetic: fixed-point values round(w 2^f).", low=0, high=62
    )
    secure_aggregation: bool = option(
        False,
        "the aggregator gets pairwise-masked uploads and learns only their weighted sum (dropouts "
        "recovered).",
    )

    noise_auto: ClassVar[str | None] = "laplace"

    def __post_init__(self) -> None:
        if self.extra is not None:
            check_int("extra", self.extra, 1)
        check_int("p", self.p, 2)
        check_int("block_size", self.block_size, 1)
        check_real("epsilon_local", self.epsilon_local, low=0.0)
        check_real("clip", self.clip, low=0.0)
        check_real("delta", self.delta, low=0.0, high=0.5)
        if self.noise not in NOISE_LAWS:
            raise InvalidArgumentError(
                "noise", f"expected 'laplace' or 'gaussian', got {self.noise!r}"
            )
        if self.keys not in KEY_KINDS:
            raise InvalidArgumentError("keys", f"expected one of {KEY_KINDS}, got {self.keys!r}")
        for name in ("client_noise", "secure_aggregation"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InvalidArgumentError(
                    name, f"expected True or False, got {getattr(self, name)!r}"
                )
        if self.arithmetic not in ("float", "modular"):
            raise InvalidArgumentError(
                "arithmetic", f"expected 'float' or 'modular', got {self.arithmetic!r}"
            )
        from immersion.integer import check_fraction_bits

        check_fraction_bits(self.fraction_bits)
        if self.arithmetic == "modular":
            self._check_modular()

    def key_kind(self, n_total: int) -> Literal["dense", "block"]:
        """The key structure for ``n_total`` immersed entries: ``keys``, with ``"auto"`` dense up
        to 512 entries and block above.

        Parameters
        ----------
        n_total:
            ``n~``, the encoded length.
        """
        if self.keys == "dense" or (self.keys == "auto" and n_total <= 512):
            return "dense"
        return "block"

    def _check_modular(self) -> None:
        """Options that only the float coding uses are refused, naming them."""
        defaults = SiflOptions()
        for name in ("noise", "delta", "epsilon_local", "client_noise", "secure_aggregation"):
            if getattr(self, name) != getattr(defaults, name):
                raise InvalidArgumentError(
                    name,
                    "applies to arithmetic='float'; modular coding draws its noise uniformly "
                    "modulo 2^64 (per-element epsilon 0) and sums its uploads as integers",
                )

    def check_engine(self, engine: str) -> None:
        """``client_noise`` runs on the local engine only: the Flower handshake sends the kit before
        the noise scale is calibrated.

        Parameters
        ----------
        engine:
            ``"local"`` or ``"flower"``.
        """
        if self.client_noise and engine != "local":
            raise InvalidArgumentError("client_noise", "only the local engine supports it")
