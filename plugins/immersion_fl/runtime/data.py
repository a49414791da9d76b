"""Data for the federated-learning demos: sklearn's bundled digits, or local IDX files (MNIST
style).

Nothing is downloaded. ``digits`` (8x8) can be upsampled to 28x28 so that the papers' model sizes
(MLP 784-200-200-10, CNN, CNN2) run without MNIST.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from immersion import InvalidArgumentError


@dataclass(frozen=True)
class Dataset:
    """Images in [0, 1] with shape (N, 1, H, W) and integer labels, split into train and test.

    Parameters
    ----------
    x_train, y_train:
        Training images and labels.
    x_test, y_test:
        Held-out images and labels.
    name:
        ``digits8``, ``digits28``, ``mnist`` or ``fashion``.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(1, H, W)``."""
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]

    @property
    def n_classes(self) -> int:
        """The number of classes (largest label + 1)."""
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of (N, h, w) images to (N, size, size)."""
    from scipy.ndimage import zoom

    factor = size / images.shape[-1]
    return np.clip(zoom(images, (1, factor, factor), order=1), 0.0, 1.0)


def load_digits_dataset(*, size: int = 8, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """sklearn's bundled 1,797 8x8 digits, scaled to [0, 1]; ``size=28`` upsamples them.

    Parameters
    ----------
    size:
        Image side (8: as bundled; otherwise a bilinear resize).
    test_fraction:
        The share held out for testing.
    seed:
        Seeds the train/test split.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        from immersion import OptionalDependencyError

        raise OptionalDependencyError("scikit-learn", "fl", "the digits dataset") from None
    bunch = load_digits()
    images = bunch.images.astype(np.float64) / 16.0
    if size != 8:
        images = _resize(images, size)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(test_fraction * len(images)))
    test, train = order[:n_test], order[n_test:]
    x = images[:, None, :, :]
    return Dataset(x[train], bunch.target[train], x[test], bunch.target[test], f"digits{size}")


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:  # type: ignore[operator]
            header = fh.read(4)
            if len(header) != 4 or header[:2] != b"\x00\x00" or header[2] != 0x08:
                raise InvalidArgumentError(
                    "dataset", f"{path} is not an IDX file of unsigned bytes"
                )
            ndim = header[3]
            shape = struct.unpack(">" + "I" * ndim, fh.read(4 * ndim))
            data = np.frombuffer(fh.read(), dtype=np.uint8)
    except (
        OSError,
        EOFError,
        zlib.error,
        struct.error,
    ) as exc:  # unreadable, truncated or corrupt (gzip)
        raise InvalidArgumentError("dataset", f"{path} is truncated or corrupt ({exc})") from None
    if data.size != math.prod(shape):
        raise InvalidArgumentError(
            "dataset", f"{path} is truncated: {data.size} bytes for shape {shape}"
        )
    return data.reshape(shape)


def _find(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise InvalidArgumentError("dataset", f"{folder} has no {stem} (or {stem}.gz)")


def load_idx_dataset(folder: str | Path, *, name: str = "mnist") -> Dataset:
    """MNIST or Fashion-MNIST from the four standard IDX files in ``folder`` (plain or .gz).

    Parameters
    ----------
    folder:
        The folder with ``train-images-idx3-ubyte`` and the three other files.
    name:
        The dataset's name in the result.
    """
    root = Path(folder)
    if not root.is_dir():
        raise InvalidArgumentError("dataset", f"{root} is not a folder with IDX files")
    parts = [
        _read_idx(_find(root, stem))
        for stem in (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
    ]
    xtr, ytr, xte, yte = parts
    if len(xtr) != len(ytr) or len(xte) != len(yte):
        raise InvalidArgumentError("dataset", f"{root}: image and label counts differ")
    return Dataset(
        xtr[:, None].astype(np.float64) / 255.0,
        ytr.astype(np.int64),
        xte[:, None].astype(np.float64) / 255.0,
        yte.astype(np.int64),
        name,
    )


def load_dataset(spec: str, *, seed: int = 0) -> Dataset:
    """``digits``, ``digits28``, ``mnist:PATH`` or ``fashion:PATH``.

    Parameters
    ----------
    spec:
        The dataset name (with a folder for the IDX datasets).
    seed:
        Seeds digits' train/test split.
    """
    if spec in ("digits", "digits8"):
        return load_digits_dataset(seed=seed)
    if spec == "digits28":
        return load_digits_dataset(size=28, seed=seed)
    kind, sep, path = spec.partition(":")
    if sep and kind in ("mnist", "fashion", "fashion-mnist") and path:
        return load_idx_dataset(path, name=kind)
    raise InvalidArgumentError(
        "dataset", f"expected digits, digits28, mnist:PATH or fashion:PATH, got {spec!r}"
    )


def split_clients(
    labels: np.ndarray, n_clients: int, *, split: str = "iid", alpha: float = 0.5, seed: int = 0
) -> list[np.ndarray]:
    """Indices of each client's data: ``iid`` (equal random shares) or ``dirichlet`` label skew.

    Parameters
    ----------
    labels:
        The class of every sample.
    n_clients:
        How many clients share the data.
    split:
        ``"iid"`` or ``"dirichlet"``.
    alpha:
        The Dirichlet concentration (smaller: more skew).
    seed:
        Seeds the split.

    Examples
    --------
    >>> parts = split_clients(np.arange(100) % 10, 4, seed=0)
    >>> [len(p) for p in parts], sorted(np.concatenate(parts).tolist()) == list(range(100))
    ([25, 25, 25, 25], True)
    """
    if n_clients < 1 or n_clients > len(labels):
        raise InvalidArgumentError("clients", f"expected 1..{len(labels)} clients, got {n_clients}")
    rng = np.random.default_rng(seed)
    if split == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), n_clients)]
    if split != "dirichlet":
        raise InvalidArgumentError("split", f"expected 'iid' or 'dirichlet', got {split!r}")
    if not alpha > 0:
        raise InvalidArgumentError("alpha", f"expected alpha > 0, got {alpha}")
    shares: list[list[int]] = [[] for _ in range(n_clients)]
    for label in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == label))
        cuts = (np.cumsum(rng.dirichlet(np.full(n_clients, alpha))) * len(idx)).astype(int)[:-1]
        for client, part in enumerate(np.split(idx, cuts)):
            shares[client].extend(part.tolist())
    empty = [i for i, s in enumerate(shares) if not s]
    if empty:
        raise InvalidArgumentError(
            "alpha", f"clients {empty} got no data; raise alpha or use fewer clients"
        )
    return [np.sort(np.array(s, dtype=np.int64)) for s in shares]
