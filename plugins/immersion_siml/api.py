"""SIML on the user's own torch module and data: :func:`train` (seed 002 section VI-A).

The same three steps as ``immersion siml run`` / ``encode``, ``serve``, ``decode``, in one call:
the user side encodes every sample ``y~_i = Pi1 y_i + N1 s_i`` (eq. 42) and the initial state
``x~_0 = Pi2 x_0`` (eq. 43), the service side runs the target optimizer (eq. 44,
:class:`~immersion_siml.target.TargetOptimizer`) on the encoded data only, and the user decodes
``w* = Pi3_left (w~* - Pi4 y~_0)`` (eq. 45) into a copy of the module. The user's module is
never modified.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from immersion import InvalidArgumentError
from immersion.backends import make_backend
from immersion.coding.keygen import resolve_rng

from .dynamics import TrainingPlan
from .inputs import check_module, check_outputs, require_torch, sample_tensors
from .job import PrivacyDesign, decode_model, decode_state, encode_training
from .models import LOSSES, SimlModel
from .references import plain_training
from .run import privacy_figures

if TYPE_CHECKING:
    import torch


@dataclass
class SimlTraining:
    """What :func:`train` returns.

    Parameters
    ----------
    model:
        A deep copy of the user's module (same class) holding the decoded weights ``w*``.
    epsilon_data, epsilon_model:
        Per-element epsilon of each encoded sample and of the encoded model (seed 002
        Theorem 1, against parties without the target; the service decodes both).
    decode_error_estimate:
        The probe-point estimate of the decoding error for float64 (the precision report; an
        estimate, not a bound).
    privacy:
        Every privacy and precision figure (proven epsilons, sensitivities, noise scale, the
        guarantee in words).
    history:
        One dict per epoch: ``epoch``, ``loss`` (the training loss of the decoded weights on
        ``X, Y``, computed by the user), ``seconds`` (service time of the epoch) and, with
        ``compare_plain``, ``max_abs_diff_vs_plain``.
    plan:
        The public training plan the service ran (optimizer, lr, epochs, batches and their order).
    n_params, n_params_encoded:
        Number of model parameters, and of entries of the encoded model ``w~*``.
    n_sample, n_sample_encoded:
        Entries of one sample row (flattened features and target row), and of its encoding.
    train_seconds, encode_seconds, decode_seconds:
        Service time of training (the user's per-epoch evaluation excluded), the user's encoding
        and decoding time.
    max_abs_diff_vs_plain:
        With ``compare_plain``: the largest difference between the decoded weights and plain
        training (float arithmetic), or the fixed-point twin (modular arithmetic: exactly 0.0,
        bit-identical); NaN otherwise.
    max_abs_diff_vs_float_plain:
        With ``compare_plain``: the largest difference to float plain training (modular: the
        quantisation carried through training; float: equal to ``max_abs_diff_vs_plain``).
    weights:
        The decoded flat parameter vector ``w*`` (a CPU tensor).
    """

    model: "torch.nn.Module"
    epsilon_data: float
    epsilon_model: float
    decode_error_estimate: float
    privacy: dict[str, Any]
    history: list[dict[str, Any]]
    plan: TrainingPlan
    n_params: int
    n_params_encoded: int
    n_sample: int
    n_sample_encoded: int
    train_seconds: float
    encode_seconds: float
    decode_seconds: float
    max_abs_diff_vs_plain: float = float("nan")
    max_abs_diff_vs_float_plain: float = float("nan")
    weights: Any = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready dictionary (no module, no weights)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("model", "weights", "privacy", "plan")
        }
        return {**out, **self.privacy, "plan": dataclasses.asdict(self.plan)}


def train(
    model: "torch.nn.Module",
    X: Any,
    Y: Any,
    *,
    loss: str = "cross_entropy",
    optimizer: str = "sgd",
    lr: float,
    epochs: int,
    batch_size: int,
    shuffle: bool = True,
    rng: Any = None,
    device: str | None = None,
    sync: str = "epoch",
    n_classes: int | None = None,
    compare_plain: bool = False,
    progress: Callable[[str], None] | None = None,
    **design: Any,
) -> SimlTraining:
    """Train the user's ``model`` on ``(X, Y)`` through SIML: encoded data, target optimizer,
    decoded module.

    The service side is exactly that of ``immersion siml run``: the target optimizer of seed 002
    eq. 44 on the encoded dataset, the same key design and precision checks, one target step per
    epoch (``sync="epoch"``, eq. 39's ``t``) or per mini-batch (``sync="batch"``, eqs. 40-41).
    The decoded model equals plain mini-batch training of the same module (same batches, same
    optimizer) to rounding (about 1e-12 for SGD, below 1e-9 for Adam over tens of epochs).

    Parameters
    ----------
    model:
        A ``torch.nn.Module`` with float64 parameters, no buffers (BatchNorm's running statistics
        are not carried) and no dropout in training mode. Its current parameters are the initial
        weights; it is not modified.
    X:
        Features, a real array or tensor ``(N, ...)`` of any sample shape.
    Y:
        Targets: one-hot or probability rows ``(N, C)``, or integer class labels ``(N,)``
        (one-hot encoded with ``n_classes`` columns, default ``max(Y) + 1``). ``C`` must equal the
        model's output width. With ``loss="mse"`` any real rows, or a real vector (one column).
    loss:
        ``"cross_entropy"``: mean softmax cross-entropy against the rows (what SIML uses);
        ``"mse"``: mean squared error over every output entry.
    optimizer, lr:
        ``"sgd"``, ``"momentum"`` (0.9) or ``"adam"`` (Keras' defaults, ``eps = 1e-7``), and the
        learning rate.
    epochs, batch_size:
        Passes over the data and mini-batch size (the last batch of an epoch may be shorter).
    shuffle:
        A fresh permutation of the samples every epoch, drawn from ``rng`` (True), or the samples
        in their order every epoch (False).
    rng:
        Seed or ``numpy.random.Generator`` for keys, noise and batch order (None: OS entropy).
    device:
        ``None``/``"cpu"``, or ``"cuda"``: encoding, key products and training on the GPU through
        the torch backend (float64).
    sync:
        ``"epoch"`` (default) or ``"batch"``.
    n_classes:
        Columns of the one-hot rows when ``Y`` holds class labels.
    compare_plain:
        Also run plain training (same module, data, batches, optimizer) and record the largest
        weight difference after every epoch.
    progress:
        Called with one line per epoch.
    **design:
        The privacy design (:class:`~immersion_siml.job.PrivacyDesign`): ``epsilon_data``,
        ``epsilon_model``, ``sensitivity_data``, ``sensitivity_model``, ``extra_data``,
        ``extra_state``, ``extra_model``, ``keys`` (``"auto"``, ``"dense"``, ``"block"``),
        ``block_size``, ``tolerance``; other names are refused.

    Returns
    -------
    SimlTraining
        The decoded module, the privacy and precision figures and the per-epoch history.

    Raises
    ------
    immersion.InvalidArgumentError
        Naming ``model`` (buffers, non-float64 parameters, dropout), ``X``/``Y`` (shapes, lengths,
        NaN), ``loss``, ``optimizer``, ``keys`` (dense keys too large for the model), an unknown
        design option, ...
    immersion.PrecisionError
        When float64 cannot decode the requested epsilons to ``tolerance``.

    Examples
    --------
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    >>> net = net.double()
    >>> X = torch.randn(60, 4, dtype=torch.float64)
    >>> Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
    >>> out = train(net, X, Y, lr=0.1, epochs=2, batch_size=16, rng=0, compare_plain=True)
    >>> type(out.model) is type(net), out.max_abs_diff_vs_plain < 1e-9, len(out.history)
    (True, True, 2)
    """
    torch = require_torch()
    check_module(model)
    if loss not in LOSSES:
        raise InvalidArgumentError("loss", f"expected one of {LOSSES}, got {loss!r}")
    privacy = PrivacyDesign.from_options(design)
    if not isinstance(compare_plain, bool):
        raise InvalidArgumentError(
            "compare_plain", f"expected True or False, got {compare_plain!r}"
        )
    features, targets = sample_tensors(X, Y, loss=loss, n_classes=n_classes)
    root = resolve_rng(rng, False)
    key_rng, order_rng = root.spawn(2)
    plan = TrainingPlan(
        optimizer=optimizer,
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        sync=sync,
        shuffle=shuffle,
        order_seed=int(order_rng.integers(2**63)) if shuffle is True else 0,
    )
    backend = make_backend("torch", dtype="float64", device=device)
    working = copy.deepcopy(model).to(backend.device)  # type: ignore[attr-defined]
    flat = SimlModel(working, loss=loss)
    w0 = torch.nn.utils.parameters_to_vector(working.parameters()).detach().clone()
    features, targets = backend.asarray(features), backend.asarray(targets)
    check_outputs(flat, w0, features, targets)

    start = time.perf_counter()
    user, encoded_dataset, encoded_state, x0 = encode_training(
        flat, features, targets, plan, w0, design=privacy, backend=backend, rng=key_rng
    )
    encode_seconds = time.perf_counter() - start

    # the service: eq. 44 on the encoded dataset and state only
    target = user.target
    recorder = _History(user, flat, features, targets, progress, keep_weights=compare_plain)
    start = time.perf_counter()
    encoded_model, _ = target.train(encoded_state, encoded_dataset, plan, on_epoch=recorder)
    train_seconds = time.perf_counter() - start - recorder.seconds

    start = time.perf_counter()
    w = decode_model(user, encoded_model, encoded_dataset[0])
    decode_seconds = time.perf_counter() - start

    max_diff = max_diff_float = float("nan")
    if compare_plain:
        references = {}
        for name, bits in (("float", None), ("twin", target.fraction_bits)):
            if name == "twin" and bits is None:
                continue
            epochs: list[Any] = []
            final = plain_training(
                target.dynamics,
                x0,
                features,
                targets,
                plan,
                layout=target.layout,
                fraction_bits=bits,
                on_epoch=lambda _e, params, into=epochs: into.append(params),
            )
            references[name] = (epochs, final)
        plain, w_plain = references["twin" if target.modular else "float"]
        for row, w_epoch, w_ref in zip(recorder.history, recorder.weights, plain, strict=True):
            row["max_abs_diff_vs_plain"] = float((w_epoch - w_ref).abs().max())
        max_diff = float((w - w_plain).abs().max())
        max_diff_float = float((w - references["float"][1]).abs().max())

    decoded = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(
        w.detach().to(device="cpu", dtype=torch.float64), decoded.parameters()
    )
    decoded.to(next(model.parameters()).device)
    figures = privacy_figures(user)
    return SimlTraining(
        model=decoded,
        epsilon_data=figures["epsilon_data"],
        epsilon_model=figures["epsilon_model"],
        decode_error_estimate=figures["decode_error_estimate"],
        privacy=figures,
        history=recorder.history,
        plan=plan,
        n_params=target.dynamics.n_params,
        n_params_encoded=target.n_output_encoded,
        n_sample=target.layout.n_sample,
        n_sample_encoded=target.n_input_encoded,
        train_seconds=train_seconds,
        encode_seconds=encode_seconds,
        decode_seconds=decode_seconds,
        max_abs_diff_vs_plain=max_diff,
        max_abs_diff_vs_float_plain=max_diff_float,
        weights=w.detach().cpu(),
    )


class _History:
    """After every epoch of the service: the user decodes the state and evaluates the training
    loss (one forward pass over ``X``); it keeps the weights only to compare with plain training.

    The time spent here is the user's, not the service's: it is subtracted from the timing.
    """

    def __init__(
        self,
        user: Any,
        model: SimlModel,
        features: Any,
        targets: Any,
        progress: Callable[[str], None] | None,
        *,
        keep_weights: bool,
    ) -> None:
        self.user, self.model, self.features, self.targets = user, model, features, targets
        self.progress, self.keep_weights = progress, keep_weights
        self.history: list[dict[str, Any]] = []
        self.weights: list[Any] = []
        self.seconds = 0.0
        self._last = time.perf_counter()

    def __call__(self, epoch: int, encoded_state: Any) -> None:
        start = time.perf_counter()
        w = self.user.target.dynamics.params(decode_state(self.user, encoded_state)).clone()
        loss = self.model.mean_loss(w, self.features, self.targets)
        if self.keep_weights:
            self.weights.append(w)
        self.history.append({"epoch": epoch + 1, "loss": loss, "seconds": start - self._last})
        if self.progress is not None:
            self.progress(f"epoch {epoch + 1}: loss {loss:.4g}")
        self._last = time.perf_counter()
        self.seconds += self._last - start


__all__ = ["SimlTraining", "train"]
