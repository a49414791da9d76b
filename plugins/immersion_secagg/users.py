"""The users of seed 001's schemes: their data, per-example gradients and uploads (Table 1).

Shared by the in-process engine (:mod:`immersion_secagg.engine`) and the Flower nodes of the core
secure sum (:mod:`immersion_secagg.core_flower`), which builds a user on each node with
:class:`NodeUpdates`; neither of them imports the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from immersion import InvalidArgumentError
from immersion_fl.runtime.data import load_dataset, split_clients
from immersion_fl.runtime.models import FlatModel, build_model
from immersion_fl.runtime.optimizers import (
    GradientTransformation,
    chain,
    clip_by_norm,
    dp_aggregate,
)

from .options import DpSgdOptions
from .updates import (
    clip_rows,
    full_gradient_update,
    gaussian_sampling_update,
    iid_sampling_update,
    isotropic_noise,
)
from .wfna import wfna_noise

if TYPE_CHECKING:
    from immersion_fl.runtime.engine import FederatedTask, RunConfig
    from torch import Tensor


@dataclass
class User:
    """A user's data (exactly D records) and its per-example gradients at a model."""

    index: int
    x: Tensor
    y: Tensor

    def example_gradients(self, model: Any, w: Any) -> np.ndarray:
        """Per-example cross-entropy gradients at ``w``, one example per row, ``(D, K)``."""
        import torch

        def loss(wv: Any, xi: Any, yi: Any) -> Any:
            return torch.nn.functional.cross_entropy(model.logits(wv, xi[None]), yi[None])

        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
            w, self.x, self.y
        ).numpy()

    def gradients(self, model: Any, w: Any, clip: float) -> np.ndarray:
        """The paper's ``G`` (K x D): per-example gradients clipped to ``clip``, as columns."""
        return clip_rows(self.example_gradients(model, w), clip).T

    def update(
        self, cfg: RunConfig, model: Any, w: Any, sigma2: float, t: int, *, secret: bool = False
    ) -> np.ndarray:
        """This user's upload in round ``t``. Its sampling and noise come from the run seed (the
        in-process simulation: reproducible, and the same batches as the reference run) or, with
        ``secret``, from OS entropy (Flower nodes: nobody else can recompute the noise).

        ``sgd-dp`` and ``gd-dp`` run the DP-SGD client transformation
        ``chain(clip_by_norm(C), dp_aggregate(sqrt(sigma2)))`` (:func:`dp_sgd_client`) on the
        per-example gradients of the IID batch or of all D records; ``gsgd-dp`` samples with
        Assumption 2 and adds WF-NA noise (:func:`user_update`)."""
        opt = options_of(cfg)
        rng = (
            np.random.default_rng() if secret else np.random.default_rng([cfg.seed, t, self.index])
        )
        if cfg.scheme == "gsgd-dp":
            return user_update(
                cfg.scheme, self.gradients(model, w, opt.grad_clip), cfg.batch_size, sigma2, rng
            )
        user = self
        if cfg.scheme == "sgd-dp":  # IID sampling first: only the batch's gradients are needed
            idx = rng.choice(len(self.y), cfg.batch_size, replace=False)
            user = User(self.index, self.x[idx], self.y[idx])
        client = dp_sgd_client(opt.grad_clip, math.sqrt(sigma2), rng)
        upload, _ = client.update(user.example_gradients(model, w), client.init(None), None)
        return upload


def dp_sgd_client(
    clip: float, noise_std: float, rng: np.random.Generator
) -> GradientTransformation:
    """The SGD-DP / GD-DP user of seed 001 (Table 1, isotropic rows) as a gradient transformation
    on per-example gradients: clip every row to ``clip``, average, add ``N(0, noise_std^2 I)``.
    The server then steps with ``sgd(lr)`` on the mean of the uploads (a DP-SGD client and server
    together are ``chain(clip_by_norm(C), dp_aggregate(...), sgd(lr))``, Optax's form)."""
    return chain(clip_by_norm(clip), dp_aggregate(noise_std, rng=rng))


def options_of(cfg: RunConfig) -> DpSgdOptions:
    """``cfg.options``, typed (RunConfig has checked they are seed 001's)."""
    assert isinstance(cfg.options, DpSgdOptions)
    return cfg.options


def user_update(
    scheme: str, G: np.ndarray, batch: int, sigma2: float, rng: np.random.Generator
) -> np.ndarray:
    """One user's upload for ``scheme`` from its clipped gradients ``G`` (K x D).

    With ``sigma2 = 0`` no noise is added and, for gsgd-dp, nothing is sampled (the reference run).
    """
    if scheme == "sgd-dp":
        update = iid_sampling_update(G, batch, rng)
    elif scheme == "gsgd-dp":
        if sigma2 <= 0:
            return full_gradient_update(G)
        return gaussian_sampling_update(G, batch, rng) + wfna_noise(G, batch, sigma2, rng)
    else:
        update = full_gradient_update(G)
    return update + isotropic_noise(G.shape[0], sigma2, rng) if sigma2 > 0 else update


def users_from_task(task: FederatedTask) -> list[User]:
    """One user per client of a user's task."""
    return [User(i, x, y) for i, (x, y) in enumerate(task.client_data)]


def make_users(cfg: RunConfig) -> tuple[list[User], Any, Any]:
    """The users (each trimmed to the same D records), the model and the dataset."""
    import torch

    data = load_dataset(cfg.dataset, seed=cfg.seed)
    parts = split_clients(
        data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed
    )
    samples = min(len(p) for p in parts)
    if cfg.batch_size > samples:
        raise InvalidArgumentError(
            "batch_size",
            f"expected <= the {samples} records each user holds "
            f"({len(data.y_train)} training records over {cfg.clients} users)",
        )
    users = [
        User(
            i,
            torch.as_tensor(data.x_train[p[:samples]], dtype=torch.float64),
            torch.as_tensor(data.y_train[p[:samples]], dtype=torch.long),
        )
        for i, p in enumerate(parts)
    ]
    model = FlatModel(
        build_model(
            cfg.model, image_shape=data.image_shape, n_classes=data.n_classes, hidden=cfg.hidden
        )
    )
    return users, model, data


class NodeUpdates:
    """``updates(round, user, model)`` for :func:`immersion_secagg.flower_secagg.secagg_sum`.

    Runs on the node; builds its user from the run configuration (once per worker process).
    """

    _cache: dict[tuple[str, int], tuple[User, Any]] = {}

    def __init__(self, cfg: RunConfig, sigma2: float) -> None:
        self.cfg, self.sigma2 = cfg, sigma2

    def __call__(self, t: int, user: int, model_vector: np.ndarray) -> np.ndarray:
        import torch

        key = (repr(self.cfg), user)
        if key not in self._cache:
            users, model, _ = make_users(self.cfg)
            self._cache[key] = (users[user], model)
        node, model = self._cache[key]
        return node.update(
            self.cfg, model, torch.as_tensor(model_vector), self.sigma2, t, secret=True
        )
