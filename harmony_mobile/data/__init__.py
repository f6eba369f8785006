"""Datasets (normalized image tensors, never downloaded) and non-IID client partitions."""

from harmony_mobile.data.datasets import (
    DATASETS,
    DatasetError,
    DatasetInfo,
    ImageDataset,
    dataset_info,
    find_available,
    load_dataset,
    load_labels,
    load_rows,
)
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
    "DatasetInfo",
    "dataset_info",
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
    "load_labels",
    "load_rows",
    "make_partition",
    "ood_test_indices",
    "shard_partition",
]
