"""Datasets (normalized image tensors, never downloaded) and non-IID client partitions."""

from harmony_mobile.data.datasets import DATASETS, DatasetError, ImageDataset, find_available, load_dataset
from harmony_mobile.data.partition import (
    SCHEMES,
    ClientSplit,
    Partition,
    dirichlet_partition,
    family_partition,
    make_partition,
    ood_test_indices,
    shard_partition,
)

__all__ = [
    "DATASETS",
    "SCHEMES",
    "ClientSplit",
    "DatasetError",
    "ImageDataset",
    "Partition",
    "dirichlet_partition",
    "family_partition",
    "find_available",
    "load_dataset",
    "make_partition",
    "ood_test_indices",
    "shard_partition",
]
