"""Non-IID client partitions with per-client train/val/test splits and a held-out OOD pool.

A client's *ID classes* are the classes it holds locally; every other class is *OOD* for it
(docs/ALGORITHM.md). A class counts as ID only if the client has at least MIN_TRAIN_PER_ID_CLASS
training samples of it, so one stray sample does not make a class "known". Such stray samples
stay in the client's train split and never enter its val or test split, so ID test samples are
always of ID classes.

Schemes (each a pure function of its arguments and `seed`):
- `dirichlet_partition`: per class, shares over clients drawn from Dirichlet(alpha) (Hsu et al.
  2019); alpha 0.1 is strongly skewed, alpha 100 nearly IID.
- `shard_partition`: every client holds `classes_per_client` classes (McMahan et al. 2017's
  pathological split); classes are dealt cyclically so each is used about equally often.
- `family_partition`: the class distribution follows the model family, the benchmark's hard case:
  clients of one family share a class pool, so a family never sees some classes locally.

`make_partition` first sets aside a stratified OOD pool (held by no client), then applies a scheme
to the rest; `ood_test_indices` mixes a client's ID test samples with OOD samples from that pool.
All index arrays are sorted sample indices into the dataset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

SCHEMES = ("dirichlet", "shard", "family")
MIN_TRAIN_PER_ID_CLASS = 2
DIRICHLET_DRAWS = 100  # redraws before giving up on giving every client min_samples_per_client


@dataclass(frozen=True)
class SplitOptions:
    """What every scheme shares: how a client's samples split into train/val/test, the fewest samples
    a client may end with, and which samples take part (`indices`; None = all)."""

    val_fraction: float = 0.1
    test_fraction: float = 0.2
    min_samples_per_client: int = 10
    indices: np.ndarray | None = None


@dataclass(frozen=True)
class ClientSplit:
    client_id: int
    classes: tuple[int, ...]  # the client's ID classes (sorted); every other class is OOD for it
    train: np.ndarray  # sample indices into the dataset
    val: np.ndarray
    test: np.ndarray  # ID test samples


@dataclass(frozen=True)
class Partition:
    clients: list[ClientSplit]
    ood_pool: np.ndarray  # held-out samples of every class, disjoint from all clients; OOD tests draw here


def make_partition(
    scheme: str,
    labels,
    num_clients: int,
    seed: int,
    *,
    alpha: float | None = None,
    classes_per_client: int | None = None,
    client_families: Sequence[str] | None = None,
    classes_per_family: int | None = None,
    ood_pool_fraction: float = 0.1,
    options: SplitOptions = SplitOptions(),
) -> Partition:
    """Set aside `ood_pool_fraction` of every class as the OOD pool, then split the rest with `scheme`.
    `alpha` is dirichlet's and `classes_per_client` shard's (each required by its scheme; TrainConfig
    holds their defaults)."""
    labels = _as_labels(labels)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}")
    if not 0 <= ood_pool_fraction < 1:
        raise ValueError(f"ood_pool_fraction must be in [0, 1), got {ood_pool_fraction}")
    pool_rng = np.random.default_rng((seed, 1))  # a stream independent of the scheme's own
    pool = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        pool.append(pool_rng.choice(members, int(round(len(members) * ood_pool_fraction)), replace=False))
    ood_pool = np.sort(np.concatenate(pool))
    rest = np.setdiff1d(np.arange(len(labels)), ood_pool)

    common = {"options": replace(options, indices=rest)}
    if scheme == "dirichlet":
        if alpha is None:
            raise ValueError("scheme 'dirichlet' needs alpha (the Dirichlet concentration)")
        clients = dirichlet_partition(labels, num_clients, alpha, seed, **common)
    elif scheme == "shard":
        if classes_per_client is None:
            raise ValueError("scheme 'shard' needs classes_per_client")
        clients = shard_partition(labels, num_clients, classes_per_client, seed, **common)
    else:
        if client_families is None or len(client_families) != num_clients:
            got = "none" if client_families is None else len(client_families)
            raise ValueError(
                f"scheme 'family' needs client_families with one family per client ({num_clients}), got {got}"
            )
        clients = family_partition(labels, client_families, seed, classes_per_family, **common)
    return Partition(clients=clients, ood_pool=ood_pool)


def dirichlet_partition(
    labels,
    num_clients: int,
    alpha: float,
    seed: int,
    options: SplitOptions = SplitOptions(),
) -> list[ClientSplit]:
    """Per class, give each client a share drawn from Dirichlet(alpha, ..., alpha).

    The whole draw is repeated (up to DIRICHLET_DRAWS times) until every client has at least
    `options.min_samples_per_client` samples, the usual remedy for tiny clients at small alpha.
    """
    labels, candidates = _check_common(labels, num_clients, options)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    for _ in range(DIRICHLET_DRAWS):
        owned: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels[candidates]):
            members = rng.permutation(candidates[labels[candidates] == c])
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for client, part in enumerate(np.split(members, cuts)):
                owned[client].append(part)
        sizes = [sum(len(p) for p in parts) for parts in owned]
        if min(sizes) >= options.min_samples_per_client:
            return _split_clients(owned, labels, rng, options)
    smallest = int(np.argmin(sizes))
    raise ValueError(
        f"client {smallest} received only {sizes[smallest]} samples (fewer than "
        f"min_samples_per_client={options.min_samples_per_client}) in each of {DIRICHLET_DRAWS} "
        f"Dirichlet draws; use fewer clients, a larger alpha or a smaller min_samples_per_client"
    )


def shard_partition(
    labels,
    num_clients: int,
    classes_per_client: int,
    seed: int,
    options: SplitOptions = SplitOptions(),
) -> list[ClientSplit]:
    """Each client holds `classes_per_client` classes; a class's samples are split evenly among its holders.

    Client k takes classes perm[k*m], ..., perm[k*m + m - 1] (indices mod C) of a random class
    permutation, so its classes are distinct and every class has about num_clients*m/C holders.
    With num_clients*m < C some classes have no holder: their samples are left out.
    """
    labels, candidates = _check_common(labels, num_clients, options)
    classes = np.unique(labels[candidates])
    if not 1 <= classes_per_client <= len(classes):
        raise ValueError(
            f"classes_per_client must be between 1 and the number of classes ({len(classes)}), "
            f"got {classes_per_client}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(classes)
    client_classes = [
        order[(k * classes_per_client + np.arange(classes_per_client)) % len(classes)]
        for k in range(num_clients)
    ]
    return _deal(labels, candidates, client_classes, rng, options)


def family_partition(
    labels,
    client_families: Sequence[str],
    seed: int,
    classes_per_family: int | None = None,
    options: SplitOptions = SplitOptions(),
) -> list[ClientSplit]:
    """Clients of one model family share a class pool; client k belongs to family client_families[k].

    The F families' pools are windows of `classes_per_family` consecutive classes in a random class
    order, starting at i*C//F for family i: pools of different families overlap partly, every
    class is in some pool, and every family misses at least one class (e.g. 10 classes, 3 families,
    6 classes each). Each class's samples are split evenly among all clients whose family pool
    holds it, so every client holds its whole pool. Default classes_per_family: max(ceil(C/F),
    round(0.6*C)), capped at C-1.
    """
    num_clients = len(client_families)
    labels, candidates = _check_common(labels, num_clients, options)
    families = list(dict.fromkeys(client_families))  # distinct, in order of first appearance
    classes = np.unique(labels[candidates])
    num_classes, num_families = len(classes), len(families)
    if num_families < 2:
        raise ValueError(f"family partition needs clients of at least 2 families, got {families}")
    fewest = math.ceil(num_classes / num_families)  # fewer and some class would belong to no family
    if classes_per_family is None:
        classes_per_family = min(num_classes - 1, max(fewest, round(0.6 * num_classes)))
    if not fewest <= classes_per_family <= num_classes - 1:
        raise ValueError(
            f"classes_per_family must be between {fewest} (so that {num_families} families "
            f"cover all {num_classes} classes) and {num_classes - 1} (so that every family "
            f"misses a class), got {classes_per_family}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(classes)
    pools = {
        family: order[(i * num_classes // num_families + np.arange(classes_per_family)) % num_classes]
        for i, family in enumerate(families)
    }
    client_classes = [pools[family] for family in client_families]
    return _deal(labels, candidates, client_classes, rng, options)


def ood_test_indices(
    split: ClientSplit, labels, ood_pool: np.ndarray, p: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The client's ID test samples mixed with OOD samples so that OOD make up a fraction `p`.

    OOD samples are drawn without replacement from `ood_pool`, among classes outside
    `split.classes`. For p < 1 all ID test samples are kept and round(n_id * p / (1 - p)) OOD
    samples added; p = 1 gives len(split.test) OOD samples only. If the pool is too small for that,
    ID samples are subsampled instead so the fraction stays p. The draw depends on
    (seed, client_id), so clients sharing a seed still get different OOD samples.
    Returns (indices, is_ood), ID samples first.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"the OOD fraction p must be in [0, 1], got {p}")
    labels = _as_labels(labels)
    ood_pool = np.asarray(ood_pool, dtype=np.int64)
    candidates = ood_pool[~np.isin(labels[ood_pool], split.classes)]
    n_id = len(split.test)
    if p == 0:
        return split.test.copy(), np.zeros(n_id, dtype=bool)
    if len(candidates) == 0:
        raise ValueError(
            f"client {split.client_id}: the OOD pool holds no sample outside its classes "
            f"{list(split.classes)}, so p={p} is impossible (use p=0 or a larger pool)"
        )
    n_ood, n_keep = (n_id, 0) if p == 1 else (round(n_id * p / (1 - p)), n_id)
    if n_ood > len(candidates):
        n_ood = len(candidates)
        n_keep = min(n_id, round(n_ood * (1 - p) / p))
    rng = np.random.default_rng((seed, split.client_id))
    id_part = np.sort(rng.choice(split.test, n_keep, replace=False))
    ood_part = np.sort(rng.choice(candidates, n_ood, replace=False))
    is_ood = np.concatenate([np.zeros(n_keep, dtype=bool), np.ones(n_ood, dtype=bool)])
    return np.concatenate([id_part, ood_part]), is_ood


# --------------------------------------------------------------------------- shared steps


def _as_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)  # also accepts a CPU torch tensor
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
        raise ValueError(
            f"labels must be a 1-D array of non-negative integer class ids, "
            f"got {labels.dtype} of shape {labels.shape}"
        )
    return labels.astype(np.int64)


def _check_common(labels, num_clients: int, options: SplitOptions) -> tuple[np.ndarray, np.ndarray]:
    """Validate the arguments every scheme shares; return (labels, the sample indices to distribute)."""
    indices, min_samples_per_client = options.indices, options.min_samples_per_client
    val_fraction, test_fraction = options.val_fraction, options.test_fraction
    labels = _as_labels(labels)
    candidates = np.arange(len(labels)) if indices is None else np.unique(np.asarray(indices, dtype=np.int64))
    if len(candidates) and not 0 <= candidates[0] <= candidates[-1] < len(labels):
        raise ValueError(f"indices must lie in 0..{len(labels) - 1}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > len(candidates):
        raise ValueError(f"{num_clients} clients but only {len(candidates)} samples to share among them")
    if min_samples_per_client < 1:
        raise ValueError(f"min_samples_per_client must be at least 1, got {min_samples_per_client}")
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction and test_fraction must be >= 0 and sum to less than 1, "
            f"got {val_fraction} and {test_fraction}"
        )
    return labels, candidates


def _deal(
    labels,
    candidates,
    client_classes: list[np.ndarray],
    rng: np.random.Generator,
    options: SplitOptions,
) -> list[ClientSplit]:
    """Split each class's samples evenly among the clients that hold it, then split every client."""
    holders: dict[int, list[int]] = {}
    for client, classes in enumerate(client_classes):
        for c in classes:
            holders.setdefault(int(c), []).append(client)
    owned: list[list[np.ndarray]] = [[] for _ in client_classes]
    for c, clients in sorted(holders.items()):
        members = rng.permutation(candidates[labels[candidates] == c])
        for client, part in zip(clients, np.array_split(members, len(clients)), strict=True):
            owned[client].append(part)
    for client, parts in enumerate(owned):
        size = sum(len(p) for p in parts)
        if size < options.min_samples_per_client:
            raise ValueError(
                f"client {client} received only {size} samples (min_samples_per_client="
                f"{options.min_samples_per_client}): its classes have too few samples for their "
                f"holders; use fewer clients or more data"
            )
    return _split_clients(owned, labels, rng, options)


def _split_clients(
    owned: list[list[np.ndarray]],
    labels: np.ndarray,
    rng: np.random.Generator,
    options: SplitOptions,
) -> list[ClientSplit]:
    return [
        _split_client(k, np.concatenate(parts), labels, rng, options.val_fraction, options.test_fraction)
        for k, parts in enumerate(owned)
    ]


def _split_client(
    client_id: int,
    samples: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    val_fraction: float,
    test_fraction: float,
) -> ClientSplit:
    """Split one client's samples into train/val/test, stratified by class.

    Samples are grouped by class (random order within a class) and evenly spaced ones go to test,
    then to val (systematic sampling), so every class contributes its share up to rounding and
    the totals are exact up to one sample. Classes left with fewer than MIN_TRAIN_PER_ID_CLASS
    training samples get all their samples back into train and are not ID classes.
    """
    samples = rng.permutation(samples)
    samples = samples[np.argsort(labels[samples], kind="stable")]
    is_test = _evenly_spaced(len(samples), test_fraction, rng)
    rest = samples[~is_test]
    is_val = _evenly_spaced(len(rest), val_fraction / (1 - test_fraction), rng)
    train, val, test = rest[~is_val], rest[is_val], samples[is_test]

    train_counts = np.bincount(labels[train], minlength=labels.max() + 1)
    too_rare = np.flatnonzero(train_counts < MIN_TRAIN_PER_ID_CLASS)
    val_back, test_back = np.isin(labels[val], too_rare), np.isin(labels[test], too_rare)
    train = np.concatenate([train, val[val_back], test[test_back]])
    val, test = val[~val_back], test[~test_back]

    train_counts = np.bincount(labels[train], minlength=labels.max() + 1)
    id_classes = tuple(int(c) for c in np.flatnonzero(train_counts >= MIN_TRAIN_PER_ID_CLASS))
    return ClientSplit(client_id, id_classes, np.sort(train), np.sort(val), np.sort(test))


def _evenly_spaced(n: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask over n positions marking floor or ceil of n * fraction of them, evenly spaced
    from a random offset u in [0, 1): position i is marked when i * fraction + u crosses an integer."""
    steps = np.floor(np.arange(n + 1) * fraction + rng.random())
    return np.diff(steps) > 0
