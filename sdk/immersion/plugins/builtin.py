"""Built-in plugin: the numpy and torch backends, the audit's attacks on ``immerse`` and ``lwe``.

Registered through the ``immersion`` entry-point group like any third-party plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hookspecs import AttackSpec, BackendSpec, hookimpl

if TYPE_CHECKING:
    from ..backends import ArrayBackend


def _numpy(*, dtype: str | None = None, device: str | None = None) -> ArrayBackend:
    from ..backends.numpy_backend import NumpyBackend
    from ..errors import InvalidArgumentError

    if device not in (None, "cpu"):
        raise InvalidArgumentError(
            "device", f"the numpy backend runs on the CPU only, got {device!r}"
        )
    return NumpyBackend(dtype or "float64")


def _torch(*, dtype: str | None = None, device: str | None = None) -> ArrayBackend:
    from ..backends.torch_backend import TorchBackend

    return TorchBackend(dtype or "float64", device)


@hookimpl
def immersion_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec("numpy", _numpy, "numpy float64 reference backend"),
        BackendSpec(
            "torch", _torch, "torch backend, CPU or CUDA, float32 or float64 (extra: torch)"
        ),
    ]


@hookimpl
def immersion_register_attacks() -> list[AttackSpec]:
    from ..audit.lwe import extend_specs
    from ..audit.specs import attack_specs

    return extend_specs(attack_specs())  # subspace and known-plaintext also run against "lwe"
