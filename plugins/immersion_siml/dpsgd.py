"""DP-SGD baseline (Opacus) for the SIML training service: same data, same models as plain training.

Seed 002 (Fig. 4) compares the accuracy of the immersed (SIML) training with DP-SGD at
epsilon 0.1, 0.6, 2 and 10. :func:`train_dpsgd` trains one of
:data:`~immersion_siml.models.MODEL_NAMES` with Opacus (RDP accountant, Poisson sampling,
per-sample clipping) calibrated to a target ``(epsilon, delta)``, and reports the test accuracy,
the epsilon actually spent and the wall time.

Opacus is an optional dependency (extra ``baselines``); this module imports without it.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from immersion import InvalidArgumentError

from immersion_siml.models import MODEL_NAMES, build_siml_model

#: Optimizers accepted by :func:`train_dpsgd`.
OPTIMIZERS = ("adam", "sgd")

# RDP orders: Opacus's defaults stop at 63, where the conversion term log(1/delta) / (alpha - 1)
# alone is 0.186 for delta = 1e-5, so epsilon 0.1 (seed 002 Fig. 4) would be unreachable; orders
# up to 4096 fix that.
_ALPHAS = (
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + list(range(64, 256, 8))
    + [256, 320, 384, 512, 768, 1024, 1536, 2048, 4096]
)

# Opacus / torch warnings that would repeat on every run (or every step) and carry no information
# here: the secure-RNG reminder (this is an experiment, not a deployment), the RDP "largest alpha"
# hint (raised while calibration probes huge noise levels; the bound is then conservative, never
# optimistic), and torch's notice that a full backward hook fires on a first layer whose input
# needs no gradient.
_QUIET = (
    r"Secure RNG turned off",
    r"Optimal order is the largest alpha",
    r"Full backward hook is firing when gradients are computed with respect to module outputs",
)


def opacus_available() -> bool:
    """Whether Opacus (extra ``baselines``) can be imported.

    Examples
    --------
    >>> isinstance(opacus_available(), bool)
    True
    """
    try:
        import opacus  # noqa: F401
    except ImportError:
        return False
    return True


def _opacus() -> Any:
    try:
        import opacus
    except ImportError:
        from immersion import OptionalDependencyError

        raise OptionalDependencyError("opacus", "baselines", "the DP-SGD baseline") from None
    return opacus


@dataclass(frozen=True)
class DpSgdResult:
    """Outcome of one DP-SGD run.

    Attributes
    ----------
    epsilon:
        The target epsilon the noise was calibrated to.
    epsilon_spent:
        Epsilon reported by the RDP accountant after training (at ``delta``); at most ``epsilon``
        up to Opacus's calibration tolerance.
    delta:
        The target delta.
    noise_multiplier:
        Gaussian noise standard deviation relative to ``max_grad_norm``.
    accuracy:
        Test accuracy of the final model, in [0, 1].
    seconds:
        Wall time of the training loop (no model construction, noise calibration or evaluation).
    epochs, batch_size:
        As requested (``batch_size`` is the expected size of the Poisson-sampled batches).

    Examples
    --------
    >>> r = DpSgdResult(epsilon=2.0, epsilon_spent=1.99, delta=1e-5, noise_multiplier=1.1,
    ...                 accuracy=0.8, seconds=1.5, epochs=1, batch_size=32)
    >>> sorted(r.as_dict())  # doctest: +NORMALIZE_WHITESPACE
    ['accuracy', 'batch_size', 'delta', 'epochs', 'epsilon', 'epsilon_spent',
     'noise_multiplier', 'seconds']
    """

    epsilon: float
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    accuracy: float
    seconds: float
    epochs: int
    batch_size: int

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain (JSON-serialisable) dictionary."""
        return asdict(self)


def _positive(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgumentError(name, f"expected a finite number > 0, got {value!r}")
    return float(value)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(name, f"expected an integer >= 1, got {value!r}")
    return value


def _check_arguments(
    model_name: str,
    dataset: Any,
    epsilon: Any,
    delta: Any,
    epochs: Any,
    batch_size: Any,
    lr: Any,
    optimizer: Any,
    max_grad_norm: Any,
    seed: Any,
) -> None:
    if model_name not in MODEL_NAMES:
        raise InvalidArgumentError(
            "model_name", f"expected one of {', '.join(MODEL_NAMES)}, got {model_name!r}"
        )
    if not all(hasattr(dataset, a) for a in ("x_train", "y_train", "x_test", "y_test")):
        raise InvalidArgumentError(
            "dataset", "expected a Dataset with x_train, y_train, x_test and y_test"
        )
    if len(dataset.x_train) == 0 or len(dataset.x_test) == 0:
        raise InvalidArgumentError("dataset", "expected non-empty train and test sets")
    _positive("epsilon", epsilon)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise InvalidArgumentError("delta", f"expected 0 < delta < 1, got {delta!r}")
    _positive_int("epochs", epochs)
    _positive_int("batch_size", batch_size)
    _positive("lr", lr)
    if optimizer not in OPTIMIZERS:
        raise InvalidArgumentError(
            "optimizer", f"expected one of {', '.join(OPTIMIZERS)}, got {optimizer!r}"
        )
    _positive("max_grad_norm", max_grad_norm)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidArgumentError("seed", f"expected an integer >= 0, got {seed!r}")


def train_dpsgd(
    model_name: str,
    dataset: Any,
    *,
    epsilon: float,
    delta: float = 1e-5,
    epochs: int = 5,
    batch_size: int = 32,
    lr: float = 0.001,
    optimizer: str = "adam",
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> DpSgdResult:
    """Train ``model_name`` on ``dataset`` with DP-SGD (Opacus) at ``(epsilon, delta)``.

    This is the differential-privacy baseline of seed 002, Fig. 4 (DP-SGD at epsilon 0.1, 0.6, 2
    and 10), run on the same data and the same float64 models as the plain and SIML training.
    The noise multiplier is calibrated as Opacus's ``make_private_with_epsilon`` does (RDP
    accountant, ``epochs`` passes of Poisson sampling at rate ``1 / ceil(N / batch_size)``), but
    with RDP orders up to 4096 instead of 63, without which epsilon 0.1 at delta 1e-5 is out of
    reach, and a binary-search tolerance of 0.5% of ``epsilon`` instead of 0.01 absolute.
    Per-sample gradients are clipped to ``max_grad_norm``. The loss is the mean cross-entropy on
    the integer labels.

    Parameters
    ----------
    model_name:
        One of ``mlp64``, ``nn-x2``, ``cnn`` (see :func:`~immersion_siml.models.build_siml_model`).
    dataset:
        An :class:`immersion_fl.runtime.data.Dataset` (images (N, C, H, W) in [0, 1], integer
        labels).
    epsilon, delta:
        Target privacy budget; ``epsilon > 0`` and ``0 < delta < 1``.
    epochs, batch_size, lr, max_grad_norm:
        Training length, expected batch size, learning rate and per-sample clipping norm.
    optimizer:
        ``adam`` (``torch.optim.Adam(lr, eps=1e-7)``) or ``sgd`` (``torch.optim.SGD(lr)``).
    seed:
        Seeds the model initialisation, the batch sampling and the noise, so runs repeat.

    Returns
    -------
    DpSgdResult
        Target and spent epsilon, noise multiplier, test accuracy and training wall time.

    Raises
    ------
    InvalidArgumentError
        For an unknown model or optimizer, or an out-of-range number (the error names the argument).
    OptionalDependencyError
        When Opacus (extra ``baselines``) is not installed.

    Examples
    --------
    Arguments are checked before Opacus is needed:

    >>> train_dpsgd("nn-x2", None, epsilon=2.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: dataset: expected a Dataset with x_train, ... y_test

    A run (needs the ``baselines`` extra, so skipped here; ``tests/test_siml_dpsgd.py`` runs it):

    >>> from immersion_fl.runtime.data import load_dataset
    >>> r = train_dpsgd("nn-x2", load_dataset("digits"), epsilon=2.0, epochs=1)  # doctest: +SKIP
    >>> r.epsilon_spent <= 2.0, 0.0 <= r.accuracy <= 1.0  # doctest: +SKIP
    (True, True)
    """
    _check_arguments(
        model_name, dataset, epsilon, delta, epochs, batch_size, lr, optimizer, max_grad_norm, seed
    )
    _opacus()
    import numpy as np
    import torch
    from opacus import PrivacyEngine
    from opacus.accountants.utils import get_noise_multiplier

    torch.manual_seed(seed)
    model = build_siml_model(
        model_name,
        feature_shape=tuple(dataset.x_train.shape[1:]),
        n_classes=int(max(np.max(dataset.y_train), np.max(dataset.y_test))) + 1,
    )
    x_train = torch.as_tensor(np.asarray(dataset.x_train, dtype=np.float64))
    y_train = torch.as_tensor(np.asarray(dataset.y_train, dtype=np.int64))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train),
        batch_size=batch_size,
        generator=torch.Generator().manual_seed(seed),
    )
    opt: Any = (
        torch.optim.Adam(model.parameters(), lr=lr, eps=1e-7)
        if optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=lr)
    )

    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        engine = PrivacyEngine(accountant="rdp")
        try:
            noise_multiplier = get_noise_multiplier(
                target_epsilon=float(epsilon),
                target_delta=float(delta),
                sample_rate=1 / len(loader),
                epochs=epochs,
                accountant="rdp",
                epsilon_tolerance=0.005 * float(epsilon),
                alphas=_ALPHAS,
            )
        except ValueError as error:  # "The privacy budget is too low." (noise multiplier above 1e6)
            raise InvalidArgumentError(
                "epsilon", f"{epsilon} is out of reach at delta {delta}: {error}"
            ) from None
        private_model, private_opt, private_loader = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=float(max_grad_norm),
            noise_generator=torch.Generator().manual_seed(seed + 1),
        )
        private_model.train()
        start = time.perf_counter()
        for _ in range(epochs):
            for xb, yb in private_loader:
                private_opt.zero_grad()
                if len(yb) == 0:  # an empty Poisson batch still takes a (pure-noise) step
                    loss = private_model(xb).sum() * 0.0
                else:
                    loss = torch.nn.functional.cross_entropy(private_model(xb), yb)
                loss.backward()
                private_opt.step()
        seconds = time.perf_counter() - start
        epsilon_spent = float(engine.accountant.get_epsilon(float(delta), alphas=_ALPHAS))

    model.eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(dataset.x_test, dtype=np.float64)))
        accuracy = float((logits.argmax(dim=1).numpy() == np.asarray(dataset.y_test)).mean())
    return DpSgdResult(
        epsilon=float(epsilon),
        epsilon_spent=epsilon_spent,
        delta=float(delta),
        noise_multiplier=float(private_opt.noise_multiplier),
        accuracy=accuracy,
        seconds=seconds,
        epochs=epochs,
        batch_size=batch_size,
    )


__all__ = ["OPTIMIZERS", "DpSgdResult", "opacus_available", "train_dpsgd"]
