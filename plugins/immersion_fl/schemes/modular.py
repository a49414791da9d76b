"""SIFL in exact integer arithmetic modulo 2^64 (``SiflOptions(arithmetic="modular")``).

The same rounds as the float schemes (seed 000 Algorithms 1-2, seed 003), on fixed-point
integers ``q(w) = round(w 2^f)`` (:mod:`immersion.integer`) encoded with integer keys invertible
modulo 2^64 and noise uniform modulo 2^64 (:func:`immersion.keys.draw_modular_code`):

* broadcast (eq. 19): ``w~ = Pi1 g + N1 s`` with ``g`` the global model's integers and ``s``
  uniform: every element of ``w~`` is uniform whatever ``g`` is (per-element epsilon 0);
* client (section 7): decode ``q = Pi1_left w~`` exactly, train from ``w = g 2^-f`` in float,
  upload ``w~ + Pi1 (q(w_end) - q)``, which decodes to ``q(w_end)`` exactly;
* aggregation with the integer weights ``n_i = |D_i|``: ``sum n_i w~_i`` decodes to
  ``sum n_i q(w_i)`` exactly, in any order (integer addition is associative); the global model is
  ``g = round(sum n_i q_i / sum n_i)``, an integer division;
* M2 (eqs. 22-33): the aggregator's ``Pi2``, ``Pi2^R``, ``N2`` are rows and columns of a random
  unimodular matrix and its inverse modulo 2^64 (``Pi2 Pi2^R = 1``, ``N2 Pi2^R = 0``); the server
  decodes ``Pi1`` only and re-encodes the ``p`` rows of ``w_bar``; the clients combine them with
  ``Pi2^R``, decode ``sum n_i q_i`` and divide by the total weight, which the broadcast carries.

:class:`FixedPointFedAvg` is the plain twin: FedAvg on the same fixed-point integers. A scheme run
decodes to it bit for bit, round after round (tests/test_fl_modular.py); the distance to float
FedAvg is the quantisation (step ``2^-f``) carried through training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import InvalidArgumentError
from immersion.integer import (
    check_sum_headroom,
    decode_fixed,
    encode_fixed,
    random_unimodular,
    to_signed,
    uniform_noise,
    weighted_sum,
)
from immersion.keys import code_from_arrays, draw_modular_code

from ..scheme import LocalTrainer, Scheme, SchemeContext

if TYPE_CHECKING:
    import torch
    from immersion.keys.modular import ModularBlockCode, ModularDenseCode

    from .options import SiflOptions

IntegerMap = Callable[[np.ndarray], np.ndarray]
#: What a modular aggregator hands the server: the integer weighted sum ``sum n_i u_i`` (coded by
#: the aggregator in M2) and the total weight ``sum n_i``.
IntegerAggregate = tuple[np.ndarray, int]
#: Code arrays a client must not receive (they give the noise basis directly).
MODULAR_NOISE_ARRAYS = frozenset({"noise_basis", "noise_left", "noise_pos"})


def round_div(total: np.ndarray, divisor: int) -> np.ndarray:
    """``round(total / divisor)`` for signed integers (halves rounded up), exactly in int64.

    Examples
    --------
    >>> round_div(np.array([7, -7, 5, -5]), 2).tolist()
    [4, -3, 3, -2]
    """
    total = np.asarray(total, dtype=np.int64)
    quotient = np.floor_divide(total, divisor)
    remainder = total - quotient * divisor
    return quotient + (2 * remainder >= divisor)


@dataclass(frozen=True)
class IntegerBroadcast:
    """What the server sends: encoded integers, and the divisor that turns their decoded value
    into the global model's integers (1 when the server has divided already, M1 and RM).

    Parameters
    ----------
    encoded:
        ``uint64``: one encoded vector ``(n~,)``, or M2's ``p`` encoded rows ``(p, n~)``.
    divisor:
        The total weight ``sum n_i`` of the last aggregate (M2), or 1.
    """

    encoded: np.ndarray
    divisor: int = 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The broadcast as arrays (Flower messages)."""
        return {"w": self.encoded, "divisor": np.array([self.divisor], dtype=np.int64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "IntegerBroadcast":
        """Read :meth:`arrays`' output.

        Parameters
        ----------
        arrays:
            ``{"w": uint64 array, "divisor": [int]}``.
        """
        return cls(np.asarray(arrays["w"], dtype=np.uint64), int(arrays["divisor"][0]))


@dataclass(frozen=True)
class Opened:
    """A client's view of a broadcast: the combined encoding and the integers it decodes to."""

    encoded: np.ndarray
    decoded: np.ndarray


@dataclass
class ModularClientKit:
    """What a client holds: integer ``Pi1`` (lift) and ``Pi1_left`` (exact decode), M2's
    ``Pi2^R``, and the fixed-point format.

    Parameters
    ----------
    encode:
        ``q -> Pi1 q`` modulo 2^64.
    decode:
        ``w~ -> Pi1_left w~`` modulo 2^64 (exact).
    fraction_bits:
        ``f`` of ``q(w) = round(w 2^f)``.
    pi2_right:
        M2's ``Pi2^R`` (``p`` integers), or None.
    """

    encode: IntegerMap
    decode: IntegerMap
    fraction_bits: int
    pi2_right: np.ndarray | None = None

    def open(self, received: IntegerBroadcast) -> tuple[Opened, "torch.Tensor"]:
        """The decoded integers and the float model ``w = g 2^-f`` to train from.

        Parameters
        ----------
        received:
            The server's broadcast.
        """
        import torch

        encoded = received.encoded
        if encoded.ndim == 2:
            if self.pi2_right is None:
                raise InvalidArgumentError("received", "p encoded rows need M2's Pi2^R")
            encoded = weighted_sum(list(encoded), [int(v) for v in self.pi2_right])  # eq. 32
        decoded = self.decode(encoded)
        g = round_div(to_signed(decoded), received.divisor)
        w_start = torch.as_tensor(decode_fixed(g, self.fraction_bits), dtype=torch.float64)
        return Opened(encoded, decoded), w_start

    def lift(self, opened: Opened, w_start: "torch.Tensor", w_end: "torch.Tensor") -> np.ndarray:
        """``w~ + Pi1 (q(w_end) - q)``: decodes to ``q(w_end)`` exactly.

        Parameters
        ----------
        opened:
            :meth:`open`'s first output.
        w_start, w_end:
            The model before and after local training (only ``w_end`` is used).
        """
        q_end = encode_fixed(w_end.detach().cpu().numpy(), self.fraction_bits, name="w_end")
        return opened.encoded + self.encode(q_end - opened.decoded)

    @staticmethod
    def arrays(
        code: "ModularDenseCode | ModularBlockCode",
        pi2_right: np.ndarray | None,
        fraction_bits: int,
    ) -> dict[str, np.ndarray]:
        """The kit as arrays (sent once in the handshake); the noise basis is not among them.

        Parameters
        ----------
        code:
            The server's integer code.
        pi2_right:
            M2's ``Pi2^R``, or None.
        fraction_bits:
            The fixed-point format.
        """
        out = {k: v for k, v in code.arrays().items() if k not in MODULAR_NOISE_ARRAYS}
        out["fraction_bits"] = np.array([fraction_bits], dtype=np.int64)
        if pi2_right is not None:
            out["pi2_right"] = pi2_right
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "ModularClientKit":
        """Rebuild a kit on the client side (Flower engine).

        Parameters
        ----------
        arrays:
            :meth:`arrays`' output.
        """
        from immersion.keys.modular import (
            GatherInverse,
            MatrixProduct,
            ModularForward,
            ModularInverse,
            ModularMix,
            ScatterForward,
        )

        f = int(arrays["fraction_bits"][0])
        pi2_right = (
            np.asarray(arrays["pi2_right"], dtype=np.uint64) if "pi2_right" in arrays else None
        )
        if "pi" in arrays:
            return cls(MatrixProduct(arrays["pi"]), MatrixProduct(arrays["pi_left"]), f, pi2_right)
        names = (
            "blocks",
            "blocks_inv",
            "tail",
            "tail_inv",
            "shear",
            "group_ids",
            "pivot_rows",
            "row_perm",
        )
        mix = ModularMix(*(arrays[name] for name in names))
        signal = arrays["signal_pos"]
        return cls(
            ScatterForward(ModularForward(mix), signal),
            GatherInverse(ModularInverse(mix), signal),
            f,
            pi2_right,
        )


class _IntegerUploads:
    """Uploads are ``uint64`` arrays summed modulo 2^64, so the sum is order-free."""

    @property
    def upload_dtype(self) -> type[np.generic] | None:
        """Uploads are ``uint64`` arrays."""
        return np.uint64

    def weighted_sum(self, uploads: list[np.ndarray], weights: list[int]) -> np.ndarray:
        """``sum n_i u_i`` modulo 2^64 with the integer weights ``n_i``.

        Parameters
        ----------
        uploads:
            The clients' ``uint64`` uploads.
        weights:
            Their integer weights ``n_i = |D_i|``.
        """
        return weighted_sum(uploads, weights)


class FixedPointFedAvg(_IntegerUploads, Scheme["torch.Tensor", np.ndarray, IntegerAggregate]):
    """FedAvg on fixed-point integers: the exact plain twin of the modular schemes.

    Clients train from ``w = g 2^-f``; their models are quantised, ``q_i = q(w_i)``; the server
    forms ``g = round(sum n_i q_i / sum n_i)`` in integers.

    Parameters
    ----------
    fraction_bits:
        ``f`` of ``q(w) = round(w 2^f)``.
    """

    name = "fedavg-fixed-point"

    def __init__(self, fraction_bits: int) -> None:
        self.fraction_bits = fraction_bits
        self.g: np.ndarray = np.zeros(0, dtype=np.int64)

    def setup(self, w0: "torch.Tensor") -> None:
        """As in :meth:`Scheme.setup`."""
        self.g = to_signed(encode_fixed(w0.detach().cpu().numpy(), self.fraction_bits, name="w0"))
        self.n_encoded = int(self.g.size)

    def _model(self) -> "torch.Tensor":
        import torch

        return torch.as_tensor(decode_fixed(self.g, self.fraction_bits), dtype=torch.float64)

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """As in :meth:`Scheme.broadcast`: the model ``g 2^-f``."""
        return self._model()

    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> np.ndarray:
        """As in :meth:`Scheme.client_upload`: the quantised local model, ``q(w_i)``."""
        w_end = client.train(received, round_t)
        return encode_fixed(w_end.detach().cpu().numpy(), self.fraction_bits, name="w_end")

    def aggregate(self, uploads: list[np.ndarray], counts: list[int]) -> IntegerAggregate:
        """The integer sum and its total weight."""
        return self.weighted_sum(uploads, counts), int(sum(counts))

    def server_update(self, aggregated: IntegerAggregate) -> None:
        """``g = round(sum n_i q_i / sum n_i)``."""
        total, divisor = aggregated
        self.g = round_div(to_signed(total), divisor)

    def global_model(self) -> "torch.Tensor":
        """As in :meth:`Scheme.global_model`."""
        return self._model()

    def state(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.state`."""
        return {"g": self.g}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """As in :meth:`Scheme.restore`."""
        self.g = np.asarray(state["g"], dtype=np.int64)


class ModularSiflM1(_IntegerUploads, Scheme[IntegerBroadcast, np.ndarray, IntegerAggregate]):
    """SIFL M1 (and the random-matrix SIFL, ``name="sifl-rm"``) modulo 2^64.

    Parameters
    ----------
    options:
        The :class:`~immersion_fl.schemes.SiflOptions` (``arithmetic="modular"``).
    context:
        Backend and key generator from the engine (the integer arithmetic runs in numpy).
    name:
        The registered name.
    default_extra:
        ``n~ - n`` when ``options.extra`` is None.
    """

    name = "sifl-m1"

    def __init__(
        self,
        options: "SiflOptions",
        context: SchemeContext,
        *,
        name: str = "sifl-m1",
        default_extra: int = 201,
    ) -> None:
        self.options, self.name = options, name
        self.extra = options.extra or default_extra
        self.fraction_bits = options.fraction_bits
        self.rng = context.rng
        self.kit: ModularClientKit | None = None
        self.g: np.ndarray = np.zeros(0, dtype=np.int64)

    @property
    def model_norm_bound(self) -> float | None:
        """As in :meth:`Scheme.model_norm_bound`: the clients' norm bound ``C``."""
        return self.options.clip

    def plain_twin(self) -> FixedPointFedAvg:
        """FedAvg on the same fixed-point integers (the exact reference)."""
        return FixedPointFedAvg(self.fraction_bits)

    def setup(self, w0: "torch.Tensor") -> None:
        """As in :meth:`Scheme.setup`: integer keys, and ``g = q(w0)``."""
        n = int(w0.numel())
        self._use_code(
            draw_modular_code(
                n,
                self.extra,
                kind=self.options.key_kind(n + self.extra),
                block_size=self.options.block_size,
                rng=self.rng,
            )
        )
        self.g = to_signed(encode_fixed(w0.detach().cpu().numpy(), self.fraction_bits, name="w0"))
        self._noise_rng = np.random.default_rng(self.rng.integers(2**63))

    def _use_code(self, code: Any) -> None:
        """Hold the integer ``code`` and its encoders."""
        self.code = code
        self._encode_noisy = code.noisy_encoder()
        self._decode = code.decoder()
        self.kit = ModularClientKit(code.encoder(), self._decode, self.fraction_bits)
        self.key_bytes, self.n_encoded = code.nbytes, code.n_total

    def _encode(self, g: np.ndarray) -> np.ndarray:
        """``Pi1 g + N1 s`` with ``s`` uniform modulo 2^64 (eq. 19), ``g`` as two's complement."""
        q = np.asarray(g, dtype=np.int64).view(np.uint64)
        s = uniform_noise(self._noise_rng, q.shape[:-1] + (self.code.n_noise,))
        return self._encode_noisy(q, s)

    def broadcast(self, round_t: int) -> IntegerBroadcast:
        """As in :meth:`Scheme.broadcast`: ``Pi1 g + N1 s``, fresh uniform ``s``."""
        return IntegerBroadcast(self._encode(self.g))

    def client_upload(
        self, client: LocalTrainer, received: IntegerBroadcast, round_t: int
    ) -> np.ndarray:
        """As in :meth:`Scheme.client_upload` (decode exactly, train, lift)."""
        assert self.kit is not None
        opened, w_start = self.kit.open(received)
        return self.kit.lift(opened, w_start, client.train(w_start, round_t))

    def aggregate(self, uploads: list[np.ndarray], counts: list[int]) -> IntegerAggregate:
        """The integer weighted sum (coded by the aggregator in M2) and its total weight."""
        return self.aggregator_code(self.weighted_sum(uploads, counts)), int(sum(counts))

    def server_update(self, aggregated: IntegerAggregate) -> None:
        """Decode ``sum n_i q_i`` exactly (eq. 21) and divide: ``g = round(. / sum n_i)``."""
        total, divisor = aggregated
        self.g = round_div(to_signed(self._decode(total)), divisor)

    def global_model(self) -> "torch.Tensor":
        """As in :meth:`Scheme.global_model`: ``g 2^-f``."""
        import torch

        return torch.as_tensor(decode_fixed(self.g, self.fraction_bits), dtype=torch.float64)

    def design_noise(self, sizes: list[int]) -> None:
        """No noise to design (uniform noise gives epsilon 0); check that the integer sums of
        models bounded by ``C`` cannot wrap modulo 2^64."""
        check_sum_headroom(self.options.clip, sizes, self.fraction_bits, name="clip")

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Per-element epsilon 0 (every element of every encoding is uniform modulo 2^64)."""
        return {
            "epsilon_local": 0.0,
            "epsilon_global": 0.0,
            "noise": "uniform mod 2^64",
            "delta": None,
            "arithmetic": "modular",
            "fraction_bits": self.fraction_bits,
            "quantisation_step": 2.0**-self.fraction_bits,
        }

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.kit_arrays`."""
        return ModularClientKit.arrays(self.code, None, self.fraction_bits)

    def key_arrays(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.key_arrays`."""
        return dict(self.code.arrays())

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """As in :meth:`Scheme.restore_keys`: the saved integer code."""
        code = code_from_arrays(
            {k: v for k, v in arrays.items() if not k.startswith("aggregator.")}, name="Pi1"
        )
        if (code.n_total, code.n_signal) != (self.code.n_total, self.code.n_signal):
            raise InvalidArgumentError(
                "keys",
                f"the saved code is {code.n_total} x {code.n_signal}, this run's "
                f"{self.code.n_total} x {self.code.n_signal}",
            )
        self._use_code(code)

    def state(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.state`: ``g`` and the noise generator."""
        noise = json.dumps(self._noise_rng.bit_generator.state).encode()
        return {"g": self.g, "noise": np.frombuffer(noise, dtype=np.uint8)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """As in :meth:`Scheme.restore`."""
        self.g = np.asarray(state["g"], dtype=np.int64)
        self._noise_rng.bit_generator.state = json.loads(state["noise"].tobytes().decode())


class ModularSiflM2(ModularSiflM1):
    """SIFL M2 modulo 2^64: the aggregator codes the sum with ``p`` integer columns (eq. 31)."""

    name = "sifl-m2"

    def setup(self, w0: "torch.Tensor") -> None:
        """As in :meth:`ModularSiflM1.setup`, plus the aggregator's ``Pi2``, ``Pi2^R``, ``N2``."""
        super().setup(w0)
        self.p = self.options.p
        u, v = random_unimodular(self.p, self.rng)
        self._use_aggregator_keys(u, v)
        self.w_bar: np.ndarray | None = None  # the server's p rows (decoded Pi1 only)
        self.divisor = 1

    def _use_aggregator_keys(self, u: np.ndarray, v: np.ndarray) -> None:
        """``U`` and ``V = U^-1`` mod 2^64: ``Pi2 = U[0]``, ``N2 = U[1:]``, ``Pi2^R = V[:, 0]``."""
        self._unimodular = (u, v)
        self.pi2, self.pi2_right, self.n2 = u[0], v[:, 0].copy(), u[1:]  # Pi2 Pi2^R = 1
        self.kit = ModularClientKit(
            self.code.encoder(), self._decode, self.fraction_bits, self.pi2_right
        )
        self.key_bytes = self.code.nbytes + u.nbytes + v.nbytes

    def key_arrays(self) -> dict[str, np.ndarray]:
        """M1's code plus the aggregator's unimodular pair ``U``, ``V``."""
        u, v = self._unimodular
        return {**super().key_arrays(), "aggregator.u": u, "aggregator.v": v}

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """M1's, and the aggregator's ``U``, ``V`` where saved (integer draws: files of earlier
        versions re-draw them bit for bit from the seed)."""
        super().restore_keys(arrays)
        u, v = (arrays.get(f"aggregator.{k}") for k in ("u", "v"))
        if u is None or v is None:
            u, v = self._unimodular
        elif (
            u.dtype != np.uint64
            or u.shape != (self.p, self.p)
            or v.shape != u.shape
            or not np.array_equal(u @ v, np.eye(self.p, dtype=np.uint64))
        ):
            raise InvalidArgumentError("keys", "the saved U, V are not inverse p x p integers")
        self._use_aggregator_keys(u, v)

    def aggregator_code(self, w_sum: np.ndarray) -> np.ndarray:
        """``w' = w~ Pi2 + R2 N2`` with fresh uniform ``R2`` (eq. 31), as ``p`` rows."""
        r2 = uniform_noise(self._noise_rng, (self.p - 1, w_sum.shape[-1]))
        return self.pi2[:, None] * w_sum[None, :] + self.n2.T @ r2

    def server_update(self, aggregated: IntegerAggregate) -> None:
        """Decode ``Pi1`` only, row by row (eq. 25); the clients divide by the total weight."""
        total, self.divisor = aggregated
        self.w_bar = self._decode(total)

    def broadcast(self, round_t: int) -> IntegerBroadcast:
        """As in :meth:`Scheme.broadcast`: round 0 an M1 vector; then the ``p`` rows re-encoded."""
        if self.w_bar is None:
            return super().broadcast(round_t)
        s = uniform_noise(self._noise_rng, (self.p, self.code.n_noise))
        return IntegerBroadcast(self._encode_noisy(self.w_bar, s), self.divisor)

    def global_model(self) -> "torch.Tensor":
        """``w = round(w_bar Pi2^R / sum n_i) 2^-f``: what a holder of ``Pi2^R`` decodes."""
        import torch

        if self.w_bar is None:
            return super().global_model()
        combined = weighted_sum(list(self.w_bar), [int(v) for v in self.pi2_right])
        g = round_div(to_signed(combined), self.divisor)
        return torch.as_tensor(decode_fixed(g, self.fraction_bits), dtype=torch.float64)

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.kit_arrays`, with ``Pi2^R``."""
        return ModularClientKit.arrays(self.code, self.pi2_right, self.fraction_bits)

    def state(self) -> dict[str, np.ndarray]:
        """As in :meth:`Scheme.state`, with ``w_bar`` and its divisor."""
        out = super().state()
        if self.w_bar is not None:
            out["w_bar"], out["divisor"] = self.w_bar, np.array([self.divisor])
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """As in :meth:`Scheme.restore`."""
        super().restore(state)
        if "w_bar" in state:
            self.w_bar, self.divisor = state["w_bar"], int(state["divisor"][0])
