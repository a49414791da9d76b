"""Federated schemes: plain FedAvg and the immersion-coded SIFL variants (seeds 000 and 003).

Each scheme splits a round into what the server broadcasts, what a client uploads, what the
aggregator forwards and what the server keeps. ``global_model`` is the decoded model a key holder
would see (used to evaluate accuracy and to compare with FedAvg).

* ``fedavg``: the reference.
* ``sifl-m1`` (seed 000 Algorithm 1): ``w~ = Pi1 w + N1 r`` with fresh ``r`` each round; clients
  run the target optimizer (decode once, train, lift the change); the server decodes the aggregate.
* ``sifl-m2`` (seed 000 Algorithm 2): the aggregator adds a right-side code ``Pi2`` (1 x p) and
  noise ``R2 N2``; the server decodes ``Pi1`` only and re-encodes the p columns; clients recover
  ``w~ = w' Pi2^R``.
* ``sifl-rm`` (seed 003): the same algebra as M1 with the random-matrix key shape of that paper
  (``m = n + 1``: one noise column, ``M = Pi1_left``, ``G = Pi1``) and a fresh offset each round
  (unit scale: the paper gives neither a scale nor a DP analysis, so no epsilon is reported).

Options: :class:`SiflOptions` (one object for the three). ``client_noise=True`` (all three SIFL
schemes) adds to each upload fresh noise of the client's own in ``ker(Pi1_left) = range(N1)``
(:func:`kernel_noise`): the server's decode (eq. 21; eq. 25 in M2, column by column) removes it
exactly, and the difference of two uploads is no longer noise-free (the round noise ``N1 r_t`` is
shared, THREAT_MODEL.md). It does not protect against a holder of any client kit.

References
----------
Seed 000 (SIFL), Algorithms 1-2, eqs. 19-21, 25-33, Theorems 1-2, Remark 3 and section 7; seed 003
(random-matrix SIFL).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

import numpy as np
from immersion import InvalidArgumentError
from immersion.keys import DenseCode, code_arrays, code_from_arrays, draw_code
from immersion.privacy import (
    gaussian_epsilon,
    gaussian_min_sigma_bar,
    laplace_epsilon,
    laplace_scale_for,
)
from scipy.linalg import null_space

from .config import NoOptions, SchemeOptions, check_int, check_real
from .optimizers import ArrayT
from .scheme import LocalTrainer, Scheme, SchemeContext

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from immersion.backends import ArrayBackend
    from immersion.keys import StructuredCode

    from .modular import ModularSiflM1, ModularSiflM2

#: A linear map on tensors: ``Pi1`` (encode) or ``Pi1_left`` (decode) of a client kit.
TensorMap = Callable[["torch.Tensor"], "torch.Tensor"]

#: Code arrays that describe the noise basis N1: the server keeps them, clients never get them.
NOISE_ARRAYS = frozenset({"noise_basis", "noise_pos", "flat_pos"})


@dataclass
class ClientKit:
    """What a client holds to run the target optimizer: ``Pi1`` (lift), ``Pi1_left`` (decode),
    and for M2 the aggregator's ``Pi2^R`` (seed 000 notes section 1: clients can decode).

    Parameters
    ----------
    encode:
        ``w -> Pi1 w`` (no noise).
    decode:
        ``w~ -> Pi1_left w~`` (seed 000 eq. 21).
    pi2_right:
        M2's ``Pi2^R`` as a vector of ``p`` entries (eq. 32), or None (M1, random-matrix SIFL).
    """

    encode: TensorMap
    decode: TensorMap
    pi2_right: "torch.Tensor | None" = None

    def open(self, received: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """``(w~, w)`` from a broadcast: M2's ``p`` columns give ``w~ = w' Pi2^R`` (eq. 32);
        ``w = Pi1_left w~`` is the one decode the target optimizer needs (seed 000 section 7).

        Parameters
        ----------
        received:
            The broadcast: one encoded vector, or M2's ``p`` encoded columns as rows.
        """
        encoded = (
            received
            if (self.pi2_right is None or received.dim() == 1)
            else self.pi2_right @ received
        )
        return encoded, self.decode(encoded)

    def lift(
        self, encoded: "torch.Tensor", w_start: "torch.Tensor", w_end: "torch.Tensor"
    ) -> "torch.Tensor":
        """The upload after local training from ``w_start`` to ``w_end``: :func:`lift_change`.

        Parameters
        ----------
        encoded:
            ``w~``, the encoded model the client received (:meth:`open`).
        w_start, w_end:
            The decoded model before and after local training.
        """
        return lift_change(encoded, w_start, w_end, self.encode)

    @staticmethod
    def arrays(
        code: "DenseCode | StructuredCode", pi2_right: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        """The kit as plain arrays (sent once in the handshake); ``N1`` is not among them.

        Parameters
        ----------
        code:
            The server's code (:func:`immersion.keys.draw_code`).
        pi2_right:
            M2's ``Pi2^R`` (``p x 1``), or None.
        """
        out = {k: v for k, v in code_arrays(code).items() if k not in NOISE_ARRAYS}
        if pi2_right is not None:
            out["pi2_right"] = pi2_right
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], backend: "ArrayBackend") -> "ClientKit":
        """Rebuild a kit on the client side (Flower engine).

        Parameters
        ----------
        arrays:
            :meth:`arrays`' output.
        backend:
            The array backend the kit computes with (torch, float64).
        """
        from immersion.keys.codes import (
            DenseDecoder,
            DenseEncoder,
            StructuredDecoder,
            StructuredEncoder,
        )
        from immersion.keys.structured import MixParams, OrthogonalTransform

        enc: TensorMap
        dec: TensorMap
        if "pi" in arrays:
            enc, dec = DenseEncoder(arrays["pi"], backend), DenseDecoder(arrays["pi_left"], backend)
        else:
            mix = MixParams(
                arrays["blocks"],
                arrays["tail"],
                arrays["householder"],
                arrays["group_ids"],
                arrays["row_perm"],
            )
            transform, scale = OrthogonalTransform(mix, backend), float(arrays["signal_scale"][0])
            enc = StructuredEncoder(transform, arrays["signal_pos"], backend, scale)
            dec = StructuredDecoder(transform, arrays["signal_pos"], backend, scale)
        pi2_right = backend.asarray(arrays["pi2_right"][:, 0]) if "pi2_right" in arrays else None
        return cls(enc, dec, pi2_right)


def kernel_noise(kit: ClientKit, z: "torch.Tensor") -> "torch.Tensor":
    """``(I - Pi1 Pi1_left) z``: the part of ``z`` in ``ker(Pi1_left)``, from the client kit alone.

    Keys drawn here have ``Pi1 = a Q_S`` and ``N1 = Q_N`` with ``Q`` orthogonal, so this is the
    orthogonal projection onto ``range(N1)``; for any left inverse it lies in ``ker(Pi1_left)``,
    which is all exact decoding needs (seed 000 eq. 21: ``Pi1_left (Pi1 w + N1 r + e) = w`` for
    every such ``e``). With ``z ~ N(0, sigma^2 I)`` the result has the law of ``N1 s`` with
    ``s ~ N(0, sigma^2 I_m)``; with Laplace ``z`` each element is a mix of ``n~`` Laplace variables
    (same variance as ``(N1 s)_j``).

    Parameters
    ----------
    kit:
        The client's kit.
    z:
        A vector of the encoded size ``n~``.

    Examples
    --------
    >>> import torch
    >>> from immersion.backends import make_backend
    >>> from immersion.keys import draw_code
    >>> code = draw_code(4, 3, kind="dense", rng=0)
    >>> be = make_backend("torch", dtype="float64", device="cpu")
    >>> kit = ClientKit(code.encoder(be), code.decoder(be))
    >>> e = kernel_noise(kit, torch.ones(7, dtype=torch.float64))
    >>> bool(kit.decode(e).abs().max() < 1e-12)
    True
    """
    return z - kit.encode(kit.decode(z))


def lift_change(
    encoded: ArrayT, before: ArrayT, after: ArrayT, encoder: Callable[[ArrayT], ArrayT]
) -> ArrayT:
    """Target-optimizer lift (seed 000 eq. 20 summed over the local steps):
    ``w~ - Pi1 (w_before - w_after)``.

    Parameters
    ----------
    encoded:
        ``w~``, the encoded model the local training started from.
    before, after:
        The decoded model before and after local training.
    encoder:
        ``d -> Pi1 d``.

    Examples
    --------
    >>> import numpy as np
    >>> lift_change(np.array([5.0]), np.array([1.0]), np.array([0.5]), lambda d: 2 * d).tolist()
    [4.0]
    """
    return encoded - encoder(before - after)


def client_upload(
    kit: ClientKit | None, client: LocalTrainer, received: "torch.Tensor", round_t: int
) -> "torch.Tensor":
    """One client's round, identical on every engine.

    FedAvg (no kit): train from the broadcast model. SIFL: recover ``w~`` (M2: ``w' Pi2^R``,
    eq. 32), decode once, train with the ordinary optimizer, lift the change (seed 000 section 7).

    Parameters
    ----------
    kit:
        The client's kit, or None (FedAvg).
    client:
        Its local training.
    received:
        The server's broadcast.
    round_t:
        The round (seeds the client's batch order).
    """
    if kit is None:
        return client.train(received, round_t)
    encoded, w_start = kit.open(received)
    return kit.lift(encoded, w_start, client.train(w_start, round_t))


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
        keys and uniform noise modulo 2^64 (:mod:`immersion_fl.modular`): per-element epsilon 0
        and decoding bit-identical to FedAvg on the same fixed-point values.
    fraction_bits:
        ``f`` of the fixed-point values ``round(w 2^f)`` (modular arithmetic).
    secure_aggregation:
        The aggregator receives pairwise-masked uploads and learns only their weighted sum
        (:mod:`immersion_fl.secure`, the core's :mod:`immersion.securesum.protocol`; dropouts
        recovered).

    Examples
    --------
    >>> SiflOptions(p=3).p
    3
    >>> SiflOptions.from_flags({"noise": "auto", "graph": "complete"}).noise
    'laplace'
    """

    extra: int | None = None
    p: int = 2
    epsilon_local: float = 1.0
    noise: str = "laplace"
    delta: float = 1e-5
    clip: float = 100.0
    keys: str = "auto"
    block_size: int = 8
    client_noise: bool = False
    arithmetic: str = "float"
    fraction_bits: int = 32
    secure_aggregation: bool = False

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


class FedAvg(Scheme["torch.Tensor", "torch.Tensor", "torch.Tensor"]):
    """Plain federated averaging (seed 000 eq. 2): the reference every scheme is compared with.

    Parameters
    ----------
    reverse_sum:
        Add the weighted uploads last to first (:meth:`weighted_sum`): the same average up to
        float64 rounding, the reference drift of a run (``run_federated(reference_drift=True)``).

    Examples
    --------
    >>> import torch
    >>> s = FedAvg()
    >>> s.setup(torch.zeros(2, dtype=torch.float64))
    >>> s.broadcast(0).tolist(), s.upload_shape
    ([0.0, 0.0], (2,))
    """

    name = "fedavg"
    #: The server's model (set by :meth:`setup`).
    w: "torch.Tensor"

    def __init__(self, *, reverse_sum: bool = False) -> None:
        self.kit: ClientKit | None = None
        self.reverse_sum = reverse_sum

    def weighted_sum(self, uploads: list["torch.Tensor"], weights: list[float]) -> "torch.Tensor":
        """``sum_i a_i w_i`` with ``sum_i a_i = 1`` (the aggregation of seed 000 eq. 2); with
        ``reverse_sum`` the terms are added last to first (the reference drift of a run).

        Parameters
        ----------
        uploads:
            The clients' uploads.
        weights:
            Their weights ``a_i = |D_i| / |D|`` (over the clients that answered).
        """
        terms = [w * u for w, u in zip(weights, uploads, strict=True)]
        if self.reverse_sum:
            terms.reverse()
        return sum(terms, _torch().zeros_like(terms[0]))  # 0 + t_0 + t_1 + ..., as sum() adds

    def aggregate(self, uploads: list["torch.Tensor"], counts: list[int]) -> "torch.Tensor":
        """:meth:`weighted_sum` with the weights ``n_i / sum n_i``, then :meth:`aggregator_code`.

        Parameters
        ----------
        uploads, counts:
            As in :meth:`Scheme.aggregate <immersion_fl.scheme.Scheme.aggregate>`.
        """
        total = sum(counts)
        return self.aggregator_code(self.weighted_sum(uploads, [n / total for n in counts]))

    def setup(self, w0: "torch.Tensor") -> None:
        """Keep a copy of the initial model.

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        self.w = w0.clone()
        self.n_encoded = int(w0.numel())

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """The global model, in the clear.

        Parameters
        ----------
        round_t:
            The round (unused).
        """
        return self.w

    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> "torch.Tensor":
        """The client's locally trained model (:func:`client_upload`).

        Parameters
        ----------
        client, received, round_t:
            As in :meth:`Scheme.client_upload <immersion_fl.scheme.Scheme.client_upload>`.
        """
        return client_upload(self.kit, client, received, round_t)

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """The weighted mean of the uploads is the new global model.

        Parameters
        ----------
        aggregated:
            The aggregator's output.
        """
        self.w = aggregated

    def global_model(self) -> "torch.Tensor":
        """The global model."""
        return self.w

    def state(self) -> dict[str, np.ndarray]:
        """``{"w": the global model}``."""
        return {"w": self.w.cpu().numpy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        self.w = _torch().as_tensor(state["w"])


class SiflM1(FedAvg):
    """SIFL M1 (seed 000 Algorithm 1) and, with one noise column and no DP figures, the
    random-matrix SIFL of seed 003.

    Parameters
    ----------
    options:
        The :class:`SiflOptions`.
    context:
        Backend and key generator from the engine.
    name:
        The registered name (``sifl-m1`` or ``sifl-rm``).
    default_extra:
        ``n~ - n`` when ``options.extra`` is None.
    report_dp:
        Whether the scheme designs noise for ``epsilon_local`` and reports epsilons (seed 003
        gives neither a scale nor a DP analysis: ``sifl-rm`` keeps unit scale and reports none).
    """

    name = "sifl-m1"
    #: What every client holds (set by :meth:`setup`).
    kit: ClientKit

    def __init__(
        self,
        options: SiflOptions,
        context: SchemeContext,
        *,
        name: str = "sifl-m1",
        default_extra: int = 201,
        report_dp: bool = True,
    ) -> None:
        super().__init__()
        self.options, self.name, self.report_dp = options, name, report_dp
        self.extra = options.extra or default_extra
        self.noise, self.delta, self.clip = options.noise, options.delta, options.clip
        self.epsilon_local, self.client_noise = options.epsilon_local, options.client_noise
        self.secure_aggregation = bool(options.secure_aggregation)
        self.rng, self.backend = context.rng, context.backend
        self.noise_scale = 1.0
        #: Simulation only: seeds the clients' noise (None: OS entropy).
        self.client_entropy: int | None = None

    @property
    def model_norm_bound(self) -> float | None:
        """The clients' model norm bound ``C`` (``clip``; seed 000 Remark 3)."""
        return self.clip

    def setup(self, w0: "torch.Tensor") -> None:
        """Draw the keys (dense or block-structured) for ``w0``'s size and keep ``w0``.

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        n = int(w0.numel())
        kind = self.options.key_kind(n + self.extra)
        dense_bytes = 3 * 8 * (n + self.extra) ** 2  # Pi1, Pi1_left and N1 as dense matrices
        if kind == "dense" and dense_bytes > DENSE_KEY_BYTES:
            raise InvalidArgumentError(
                "keys",
                f"dense keys for a model of {n:,} parameters (+{self.extra}) need about "
                f"{dense_bytes / 2**30:.1f} GiB; use keys='block' (O(n * block_size) memory) "
                "or 'auto'",
            )
        self._use_code(
            draw_code(n, self.extra, kind=kind, block_size=self.options.block_size, rng=self.rng)
        )
        self._noise = self.backend.noise_stream(self.rng)
        self.w = w0.clone()
        self._os_entropy = secrets.randbits(64)

    def _use_code(self, code: "DenseCode | StructuredCode") -> None:
        """Hold ``code`` (``Pi1``, ``Pi1_left``, ``N1``) and its runtime encoders."""
        be = self.backend
        self.code = code
        self._encode = code.encoder(be)
        self._decode = code.decoder(be)
        self._encode_noisy = code.noisy_encoder(be)
        self.kit = ClientKit(self._encode, self._decode)
        self.key_bytes = code.nbytes
        self.n_encoded = code.n_total

    def key_arrays(self) -> dict[str, np.ndarray]:
        """The code's arrays (``N1`` included): what a checkpoint saves."""
        return code_arrays(self.code)

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """Use the saved code (:meth:`key_arrays`) instead of the one :meth:`setup` drew.

        Parameters
        ----------
        arrays:
            As in :meth:`Scheme.restore_keys <immersion_fl.scheme.Scheme.restore_keys>`.
        """
        code = code_from_arrays(arrays, name="Pi1")
        if code.n_total != self.code.n_total or code.n_signal != self.code.n_signal:
            raise InvalidArgumentError(
                "keys",
                f"the saved code is {code.n_total} x {code.n_signal}, this run's "
                f"{self.code.n_total} x {self.code.n_signal}",
            )
        self._use_code(code)

    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> "torch.Tensor":
        """:func:`client_upload`, plus with ``client_noise`` the client's own noise in
        ``ker(Pi1_left)``.

        ``z`` has the round noise's law and scale per entry (``noise``, ``noise_scale``), so each
        element has the variance of the broadcast's round noise (M1, RM: that of the upload's too;
        M2's upload noise is scaled by ``||Pi2^R||``). ``epsilon_local`` is unchanged (independent
        noise added to a DP release is post-processing); ``privacy()`` adds ``epsilon_difference``.
        In this in-process simulation client ``i`` seeds its generator with
        ``(client_entropy, round, i)``; a deployment draws it on the client, from its own entropy.

        Parameters
        ----------
        client, received, round_t:
            As in :meth:`Scheme.client_upload <immersion_fl.scheme.Scheme.client_upload>`.
        """
        upload = client_upload(self.kit, client, received, round_t)
        if not self.client_noise:
            return upload
        entropy = self.client_entropy if self.client_entropy is not None else self._os_entropy
        rng = np.random.default_rng([entropy, round_t, client.index])
        draw = rng.laplace if self.noise == "laplace" else rng.normal
        z = _torch().as_tensor(
            draw(0.0, self.noise_scale, tuple(upload.shape)),
            dtype=upload.dtype,
            device=upload.device,
        )
        return upload + kernel_noise(self.kit, z)

    def _fresh_noise(self, rows: tuple[int, ...] = ()) -> "torch.Tensor":
        return self._draw(rows + (self.code.n_noise,))

    def _draw(self, shape: tuple[int, ...]) -> "torch.Tensor":
        draw = self._noise.laplace if self.noise == "laplace" else self._noise.normal
        return draw(shape, 0.0, self.noise_scale)

    def _sensitivity_rows(self, delta_w: float) -> np.ndarray:
        """Per-element data sensitivity: ``||Pi1^j||_1 Delta_1`` (Laplace) or
        ``||Pi1^j||_2 Delta_2`` (Gaussian)."""
        stats = self.code.row_stats()
        return (stats.l1_signal if self.noise == "laplace" else stats.l2_signal) * delta_w

    def _epsilons(self, sensitivity: np.ndarray, sigma_bar: np.ndarray) -> np.ndarray:
        if self.noise == "laplace":
            return laplace_epsilon(sensitivity, sigma_bar, 1.0)  # eq. 41
        return gaussian_epsilon(sensitivity, sigma_bar, self.delta)  # eq. 44

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """``Pi1 w + N1 r_t`` with a fresh offset every round (seed 000 eq. 19).

        Parameters
        ----------
        round_t:
            The round (the noise stream advances on every call).
        """
        return self._encode_noisy(self.w, self._fresh_noise())  # eq. 19, fresh offset every round

    def encode_for_clients(self, w: "torch.Tensor") -> "torch.Tensor":
        """``Pi1 w + N1 r`` with fresh round noise (eq. 19's code for any model ``w``; a kit
        decodes it).

        Parameters
        ----------
        w:
            A flat model vector (original coordinates).
        """
        return self._encode_noisy(w, self._fresh_noise())

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """``Pi1`` and ``Pi1_left`` as arrays (never ``N1``); refused with ``client_noise``."""
        self._refuse_client_noise_remotely()
        return ClientKit.arrays(self.code, None)

    def _refuse_client_noise_remotely(self) -> None:
        if self.client_noise:
            raise InvalidArgumentError(
                "client_noise",
                "only the local engine supports it (the Flower handshake "
                "sends the kit before the noise scale is calibrated)",
            )

    def state(self) -> dict[str, np.ndarray]:
        """The global model, the noise generator's state and the noise scale."""
        return {
            "w": self.w.cpu().numpy(),
            "noise": np.frombuffer(self._noise.get_state(), dtype=np.uint8),
            "noise_scale": np.array([self.noise_scale]),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        self.w = _torch().as_tensor(state["w"])
        self._noise.set_state(state["noise"].tobytes())
        self.noise_scale = float(state["noise_scale"][0])

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """Decode the aggregate: ``w = Pi1_left w~`` (seed 000 eq. 21).

        Parameters
        ----------
        aggregated:
            The weighted sum of the encoded uploads.
        """
        self.w = self._decode(aggregated)  # eq. 21

    def _noise_rows(self) -> np.ndarray:
        """Element noise scale per unit sigma: ``||N1^j||_2`` (times ``||Pi2^R||`` in M2)."""
        return self.code.row_stats().l2_noise

    def design_noise(self, sizes: list[int]) -> None:
        """Noise scale meeting ``epsilon_local`` at the worst element (seed 000 eq. 41 or eq. 44;
        Remark 3: Delta = 2C/|D_i|). Without a DP claim (sifl-rm) the offset keeps unit scale.

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        if not self.report_dp:
            return
        sens = self._sensitivity_rows(2 * self.clip / min(sizes))
        if self.noise == "laplace":
            needed = laplace_scale_for(sens, self._noise_rows(), self.epsilon_local)
        else:
            needed = float(
                np.max(
                    gaussian_min_sigma_bar(sens, self.epsilon_local, self.delta)
                    / self._noise_rows()
                )
            )
        self.noise_scale = needed

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Per-element epsilon of uploads (Delta = 2C/|D_i|) and of the broadcast (Delta = 2C/|D|).

        M1 re-encodes the decoded global model with the same law, so eq. 41/44 applies to both.

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        if not self.report_dp:
            return {"epsilon_local": None, "epsilon_global": None}
        sigma_bar = self._noise_rows() * self.noise_scale
        local = self._epsilons(self._sensitivity_rows(2 * self.clip / min(sizes)), sigma_bar)
        glob = self._epsilons(self._sensitivity_rows(2 * self.clip / sum(sizes)), sigma_bar)
        out = {
            "epsilon_local": float(local.max()),
            "epsilon_global": float(glob.max()),
            "noise": self.noise,
            "delta": None if self.noise == "laplace" else self.delta,
        }
        if self.client_noise:
            out["epsilon_difference"] = self._epsilon_difference(sizes)
        return out

    def _epsilon_difference(self, sizes: list[int]) -> float | None:
        """Per-element epsilon of the difference of two uploads with ``client_noise`` (Gaussian
        only).

        The shared round noise cancels; what is left is ``N1 (s_i - s_k)`` with independent
        ``s ~ N(0, sigma^2 I_m)`` (see :func:`kernel_noise`), so eq. 44 applies with
        ``sigma_bar_j = sqrt(2) sigma ||N1^j||_2`` and the sensitivity of one upload. For Laplace
        the client noise is not the law of seed 000 Theorem 1: no epsilon is claimed (None).
        Without ``client_noise`` the difference is noise-free (no finite epsilon).
        """
        if self.noise != "gaussian":
            return None
        sigma_bar = np.sqrt(2.0) * self.code.row_stats().l2_noise * self.noise_scale
        sens = self._sensitivity_rows(2 * self.clip / min(sizes))
        return float(gaussian_epsilon(sens, sigma_bar, self.delta).max())


class SiflM2(SiflM1):
    """SIFL M2: aggregator coding ``w' = w~ Pi2 + R2 N2`` with ``p >= 2`` columns (seed 000
    eqs. 22-33). Parameters as :class:`SiflM1`'s (``options.p`` sets the columns)."""

    name = "sifl-m2"
    #: The server's n x p matrix, as p rows (None before the first aggregation).
    w_bar: "torch.Tensor | None"

    def setup(self, w0: "torch.Tensor") -> None:
        """Draw the keys of :class:`SiflM1`, then the aggregator's ``Pi2`` (1 x p),
        ``Pi2^R`` and ``N2`` (``N2 Pi2^R = 0``).

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        self.p = self.options.p
        super().setup(w0)
        pi2 = self.rng.uniform(0.5, 1.5, size=(1, self.p)) * self.rng.choice(
            [-1.0, 1.0], size=(1, self.p)
        )
        pi2_right = pi2.T / float((pi2 @ pi2.T)[0, 0])  # Pi2 Pi2^R = 1
        n2 = null_space(pi2_right.T).T  # (p-1) x p with N2 Pi2^R = 0
        self._use_aggregator_keys(pi2, pi2_right, n2)
        self.w_bar = None

    def _use_aggregator_keys(self, pi2: np.ndarray, pi2_right: np.ndarray, n2: np.ndarray) -> None:
        """Hold ``Pi2`` (1 x p), ``Pi2^R`` (p x 1) and ``N2`` ((p-1) x p) as tensors."""
        torch = _torch()
        as_t = {"dtype": torch.float64, "device": self.w.device}
        self.pi2, self.pi2_right, self.n2 = (
            torch.as_tensor(a, **as_t) for a in (pi2, pi2_right, n2)
        )
        self._pi2_right_array = pi2_right
        self.kit = ClientKit(self._encode, self._decode, self.pi2_right[:, 0])
        self.key_bytes = self.code.nbytes + pi2.nbytes + pi2_right.nbytes + n2.nbytes

    def key_arrays(self) -> dict[str, np.ndarray]:
        """M1's code plus the aggregator's ``Pi2``, ``Pi2^R`` and ``N2``."""
        aggregator = {"pi2": self.pi2, "pi2_right": self.pi2_right, "n2": self.n2}
        return {
            **super().key_arrays(),
            **{f"aggregator.{k}": v.cpu().numpy() for k, v in aggregator.items()},
        }

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """M1's :meth:`~SiflM1.restore_keys`, and the aggregator's keys where they were saved.

        Checkpoints written before the aggregator's keys were saved hold the code only: their
        ``Pi2`` is the one
        :meth:`setup` re-drew from the seed, bit for bit on every machine (uniform draws and
        signs only), and ``Pi2^R``, ``N2`` follow from it (on another CPU to rounding; any
        ``N2`` with ``N2 Pi2^R = 0`` cancels the aggregator's noise).

        Parameters
        ----------
        arrays:
            As in :meth:`Scheme.restore_keys <immersion_fl.scheme.Scheme.restore_keys>`.
        """
        super().restore_keys({k: v for k, v in arrays.items() if not k.startswith("aggregator.")})
        names = ("pi2", "pi2_right", "n2")
        if all(f"aggregator.{k}" in arrays for k in names):
            pi2, pi2_right, n2 = (
                np.asarray(arrays[f"aggregator.{k}"], dtype=np.float64) for k in names
            )
            if (
                pi2.shape != (1, self.p)
                or pi2_right.shape != (self.p, 1)
                or n2.shape != (self.p - 1, self.p)
            ):
                raise InvalidArgumentError(
                    "keys", f"the saved Pi2, Pi2^R, N2 do not have p = {self.p} columns"
                )
        else:
            pi2, pi2_right, n2 = (getattr(self, k).cpu().numpy() for k in names)
        self._use_aggregator_keys(pi2, pi2_right, n2)

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """Round 0: M1's ``Pi1 w + N1 r``; then the ``p`` encoded columns of ``w_bar`` (eq. 26).

        Parameters
        ----------
        round_t:
            The round.
        """
        if self.w_bar is None:  # round 0: a plain M1 vector
            return super().broadcast(round_t)
        return self._encode_noisy(
            self.w_bar, self._fresh_noise((self.p,))
        )  # eq. 26: p encoded columns

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """M1's kit plus ``Pi2^R``."""
        self._refuse_client_noise_remotely()
        return ClientKit.arrays(self.code, self._pi2_right_array)

    def state(self) -> dict[str, np.ndarray]:
        """M1's state plus ``w_bar`` (after round 0)."""
        out = super().state()
        if self.w_bar is not None:
            out["w_bar"] = self.w_bar.cpu().numpy()
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        super().restore(state)
        self.w_bar = _torch().as_tensor(state["w_bar"]) if "w_bar" in state else None

    def aggregator_code(self, w_sum: "torch.Tensor") -> "torch.Tensor":
        """``w' = w~ Pi2 + R2 N2`` with fresh ``R2`` (eq. 31), as ``p`` rows.

        Parameters
        ----------
        w_sum:
            The weighted sum of the encoded uploads.
        """
        r2 = self._draw((self.p - 1, self.code.n_total))
        return self.pi2[0][:, None] * w_sum[None, :] + self.n2.T @ r2

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """``w_bar = Pi1_left w'`` column by column (eq. 25: the server decodes ``Pi1`` only).

        Parameters
        ----------
        aggregated:
            The aggregator's ``p`` coded rows.
        """
        self.w_bar = self._decode(aggregated)  # eq. 25: decode Pi1 only, p rows

    def _pi2_right_norm(self) -> float:
        return float(self.pi2_right.norm())

    def _noise_rows(self) -> np.ndarray:
        return super()._noise_rows() * self._pi2_right_norm()  # b = N1 R1 Pi2^R (eq. 37)

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Eq. 41/44 (local) and eq. 42/53 (global, the paper's summed form, which seed000 notes
        section 12 show to be optimistic: the true element std is the root of the sum of squares).

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        out = super().privacy(sizes)
        stats = self.code.row_stats()
        pi1_left_norm = (
            float(np.linalg.norm(self.code.pi_left, 2))
            if isinstance(self.code, DenseCode)
            else 1.0 / self.code.signal_scale
        )  # block: Pi1_left = Q_S^T / a
        n2_norm = float(np.linalg.norm(self.n2.cpu().numpy(), 2))
        denom = (stats.l2_noise + stats.l2_signal * pi1_left_norm * n2_norm) * self.noise_scale
        sens = (
            self._sensitivity_rows(2 * self.clip / sum(sizes))[:, None]
            * np.abs(self.pi2.cpu().numpy())[0][None, :]
        )
        out["epsilon_global"] = float(self._epsilons(sens, denom[:, None]).max())
        return out

    def global_model(self) -> "torch.Tensor":
        """``w = w_bar Pi2^R``: what a holder of Pi2^R (clients, aggregator) decodes."""
        return self.pi2_right[:, 0] @ self.w_bar if self.w_bar is not None else self.w


def _torch() -> ModuleType:
    import torch

    return torch


def fedavg_scheme(options: NoOptions, context: SchemeContext) -> FedAvg:
    """Plain FedAvg (the reference).

    Parameters
    ----------
    options:
        None to set (:class:`~immersion_fl.config.NoOptions`).
    context:
        Unused (FedAvg draws no keys).
    """
    return FedAvg()


def sifl_m1_scheme(options: SiflOptions, context: SchemeContext) -> SiflM1 | ModularSiflM1:
    """SIFL M1 with the paper's ``n~ - n = 201`` by default (float or modular arithmetic).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM1

        return ModularSiflM1(options, context)
    return SiflM1(options, context)


def sifl_m2_scheme(options: SiflOptions, context: SchemeContext) -> SiflM2 | ModularSiflM2:
    """SIFL M2 with ``options.p`` aggregator columns (float or modular arithmetic).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM2

        return ModularSiflM2(options, context, name="sifl-m2")
    return SiflM2(options, context, name="sifl-m2")


def sifl_rm_scheme(options: SiflOptions, context: SchemeContext) -> SiflM1 | ModularSiflM1:
    """Random-matrix SIFL (seed 003): ``m = n + 1``, a fresh offset each round; float: unit
    scale and no DP figures; modular: uniform noise (per-element epsilon 0).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM1

        return ModularSiflM1(options, context, name="sifl-rm", default_extra=1)
    return SiflM1(options, context, name="sifl-rm", default_extra=1, report_dp=False)
