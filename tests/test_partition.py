"""Client partitions: disjointness, determinism, ID/OOD semantics, and every invalid argument."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harmony_mobile.data import (
    SCHEMES,
    dirichlet_partition,
    family_partition,
    make_partition,
    ood_test_indices,
    shard_partition,
)
from harmony_mobile.data.partition import MIN_TRAIN_PER_ID_CLASS, SplitOptions

FAMILIES = ["cnn", "cnn", "mobilenet", "mobilenet", "resnet", "resnet"]


def balanced_labels(num_classes=10, per_class=100, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def partition(scheme, labels, seed=0, num_clients=6, **kwargs):
    kwargs = {"alpha": 0.5, "classes_per_client": 2, **kwargs}
    return make_partition(scheme, labels, num_clients, seed, client_families=FAMILIES[:num_clients], **kwargs)


def check_invariants(clients, labels, ood_pool=np.array([], dtype=np.int64)):
    """Every sample in at most one place; ID classes and val/test samples consistent with train."""
    everything = [ood_pool] + [part for c in clients for part in (c.train, c.val, c.test)]
    used = np.concatenate(everything)
    assert len(used) == len(np.unique(used)), "a sample appears twice"
    assert used.size == 0 or (0 <= used.min() and used.max() < len(labels))
    for k, client in enumerate(clients):
        assert client.client_id == k and len(client.train) > 0
        assert list(client.classes) == sorted(set(client.classes))
        train_counts = np.bincount(labels[client.train], minlength=labels.max() + 1)
        assert client.classes == tuple(np.flatnonzero(train_counts >= MIN_TRAIN_PER_ID_CLASS))
        for part in (client.val, client.test):
            assert set(labels[part].tolist()) <= set(client.classes), "val/test sample of a non-ID class"
            assert part.dtype.kind == "i" and np.all(np.diff(part) > 0)


def same_partition(a, b):
    return np.array_equal(a.ood_pool, b.ood_pool) and all(
        x.classes == y.classes
        and all(np.array_equal(getattr(x, s), getattr(y, s)) for s in ("train", "val", "test"))
        for x, y in zip(a.clients, b.clients, strict=True)
    )


# --------------------------------------------------------------------------- invariants of every scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_invariants_and_pool(scheme):
    labels = balanced_labels()
    p = partition(scheme, labels, ood_pool_fraction=0.1)
    check_invariants(p.clients, labels, p.ood_pool)
    assert np.bincount(labels[p.ood_pool]).tolist() == [10] * 10  # stratified: 10 % of every class


@pytest.mark.parametrize("scheme", SCHEMES)
def test_reproducible_from_seed_and_different_with_another(scheme):
    labels = balanced_labels()
    assert same_partition(partition(scheme, labels, seed=3), partition(scheme, labels, seed=3))
    assert not same_partition(partition(scheme, labels, seed=3), partition(scheme, labels, seed=4))


def test_client_splits_are_stratified_with_the_requested_fractions():
    labels = balanced_labels(num_classes=5, per_class=200)
    [client] = dirichlet_partition(
        labels, 1, 1.0, seed=0, options=SplitOptions(val_fraction=0.1, test_fraction=0.2)
    )
    for c in range(5):
        assert np.sum(labels[client.test] == c) in (40, 41)  # 20 % of 200, up to rounding
        assert np.sum(labels[client.val] == c) in (19, 20, 21)
    assert abs(len(client.test) - 200) <= 1 and abs(len(client.val) - 100) <= 1


def test_a_stray_sample_does_not_make_its_class_id():
    labels = np.array([0] * 20 + [1])
    [client] = dirichlet_partition(labels, 1, 1.0, seed=0, options=SplitOptions(min_samples_per_client=1))
    assert client.classes == (0,) and 20 in client.train


def test_rare_classes_stay_in_train_instead_of_leaking_into_val_or_test():
    labels = np.array([0] * 30 + [1] * 2)  # a split of class 1 would leave one training sample
    for seed in range(10):
        [client] = dirichlet_partition(
            labels, 1, 1.0, seed=seed, options=SplitOptions(min_samples_per_client=1)
        )
        check_invariants([client], labels)
        assert client.classes == (0, 1) and {30, 31} <= set(client.train)


def test_shard_gives_each_client_its_number_of_classes():
    labels = balanced_labels()
    clients = shard_partition(labels, 10, 3, seed=1)
    check_invariants(clients, labels)
    assert all(len(c.classes) == 3 for c in clients)
    assert sorted(c for client in clients for c in client.classes) == sorted(list(range(10)) * 3)


def test_small_alpha_is_more_skewed_than_large_alpha():
    labels = balanced_labels()

    def mean_id_classes(alpha):
        clients = dirichlet_partition(
            labels, 10, alpha, seed=0, options=SplitOptions(min_samples_per_client=5)
        )
        return np.mean([len(c.classes) for c in clients])

    assert mean_id_classes(0.1) < mean_id_classes(100.0) == 10


def test_family_clients_share_a_pool_and_every_family_misses_a_class():
    labels = balanced_labels()
    p = partition("family", labels)
    pools = {}
    for family, client in zip(FAMILIES, p.clients, strict=True):
        assert pools.setdefault(family, client.classes) == client.classes
    assert all(len(pool) == 6 for pool in pools.values())  # the default for 10 classes
    assert set().union(*pools.values()) == set(range(10))
    assert len(set(pools.values())) == 3  # the pools differ between families


def test_family_pool_size_can_be_chosen():
    labels = balanced_labels()
    clients = family_partition(labels, ["a", "b", "c", "a"], seed=0, classes_per_family=4)
    assert [len(c.classes) for c in clients] == [4, 4, 4, 4] and clients[0].classes == clients[3].classes


# --------------------------------------------------------------------------- OOD test sets


@pytest.mark.parametrize("p_ood", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_ood_samples_are_outside_the_client_classes_and_make_up_fraction_p(p_ood):
    labels = balanced_labels(per_class=200)
    part = partition("family", labels, ood_pool_fraction=0.15)
    for client in part.clients:
        indices, is_ood = ood_test_indices(client, labels, part.ood_pool, p_ood, seed=0)
        assert len(indices) == len(np.unique(indices)) == len(is_ood) > 0
        assert set(indices[~is_ood]) <= set(client.test)
        assert set(indices[is_ood]) <= set(part.ood_pool)
        assert not np.isin(labels[indices[is_ood]], client.classes).any()
        assert np.isin(labels[indices[~is_ood]], client.classes).all()
        assert abs(is_ood.mean() - p_ood) <= 1 / len(indices)


def test_ood_draw_is_reproducible_and_differs_between_clients():
    labels = balanced_labels()
    part = partition("shard", labels, classes_per_client=2)
    a, _ = ood_test_indices(part.clients[0], labels, part.ood_pool, 0.5, seed=7)
    b, _ = ood_test_indices(part.clients[0], labels, part.ood_pool, 0.5, seed=7)
    c, _ = ood_test_indices(part.clients[0], labels, part.ood_pool, 0.5, seed=8)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_a_small_pool_shrinks_the_id_part_to_keep_the_fraction():
    labels = balanced_labels()
    part = partition("family", labels, ood_pool_fraction=0.01)  # one pool sample per class
    client = part.clients[0]
    indices, is_ood = ood_test_indices(client, labels, part.ood_pool, 0.5, seed=0)
    assert is_ood.sum() == 4 and len(indices) == 8  # the 4 classes outside its pool of 6


# --------------------------------------------------------------------------- property tests


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(SCHEMES),
    num_classes=st.integers(2, 8),
    num_samples=st.integers(40, 300),
    num_clients=st.integers(2, 6),
    seed=st.integers(0, 2**32 - 1),
    alpha=st.floats(0.3, 50.0),
    p_ood=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
)
def test_partitions_of_random_labels_keep_every_invariant(
    scheme, num_classes, num_samples, num_clients, seed, alpha, p_ood
):
    labels = np.random.default_rng(seed).integers(0, num_classes, num_samples)
    families = [f"family{k % 3}" for k in range(num_clients)]
    try:
        part = make_partition(
            scheme,
            labels,
            num_clients,
            seed,
            alpha=alpha,
            classes_per_client=2,
            client_families=families,
            options=SplitOptions(min_samples_per_client=1),
            ood_pool_fraction=0.15,
        )
    except ValueError as error:  # only a genuine shortage of data may stop a valid request
        assert "received only" in str(error)
        return
    check_invariants(part.clients, labels, part.ood_pool)
    for client in part.clients:
        try:
            indices, is_ood = ood_test_indices(client, labels, part.ood_pool, p_ood, seed)
        except ValueError as error:  # the client holds every class present in the pool
            assert p_ood > 0 and "no sample outside" in str(error)
            assert set(labels[part.ood_pool]) <= set(client.classes)
            continue
        assert not np.isin(labels[indices[is_ood]], client.classes).any()
        if len(indices):
            assert abs(is_ood.mean() - p_ood) <= 1 / len(indices)


# --------------------------------------------------------------------------- invalid arguments

LABELS = balanced_labels(num_classes=4, per_class=10)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: dirichlet_partition(LABELS, 2, 0.0, seed=0), "alpha must be > 0"),
        (lambda: dirichlet_partition(LABELS, 2, -1.0, seed=0), "alpha must be > 0"),
        (lambda: dirichlet_partition(LABELS, 0, 1.0, seed=0), "num_clients must be at least 1"),
        (lambda: shard_partition(LABELS, 41, 1, seed=0), "41 clients but only 40 samples"),
        (
            lambda: shard_partition(LABELS, 2, 0, seed=0),
            "classes_per_client must be between 1 and .* \\(4\\)",
        ),
        (
            lambda: shard_partition(LABELS, 2, 5, seed=0),
            "classes_per_client must be between 1 and .* \\(4\\)",
        ),
        (lambda: make_partition("iid", LABELS, 2, 0), "unknown partition scheme 'iid'.*dirichlet"),
        (
            lambda: make_partition("family", LABELS, 3, 0, client_families=["a", "b"]),
            "one family per client \\(3\\)",
        ),
        (lambda: make_partition("family", LABELS, 3, 0), "needs client_families"),
        (lambda: make_partition("dirichlet", LABELS, 2, 0), "needs alpha"),
        (lambda: make_partition("shard", LABELS, 2, 0), "needs classes_per_client"),
        (lambda: make_partition("shard", LABELS, 2, 0, ood_pool_fraction=1.0), "ood_pool_fraction"),
        (lambda: family_partition(LABELS, ["a", "a"], seed=0), "at least 2 families"),
        (lambda: family_partition(LABELS, ["a", "b"], seed=0, classes_per_family=4), "misses a class"),
        (
            lambda: family_partition(LABELS, ["a", "b", "c"], seed=0, classes_per_family=1),
            "cover all 4 classes",
        ),
        (
            lambda: dirichlet_partition(
                LABELS, 2, 1.0, seed=0, options=SplitOptions(val_fraction=0.5, test_fraction=0.5)
            ),
            "sum to less than 1",
        ),
        (lambda: dirichlet_partition(np.array([0.5, 1.5]), 1, 1.0, seed=0), "integer class ids"),
    ],
)
def test_invalid_arguments_raise_value_error_with_the_reason(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_client_without_samples_is_named_with_advice():
    with pytest.raises(
        ValueError, match=r"client \d+ received only 0 samples.*fewer clients, a larger alpha"
    ):
        dirichlet_partition(LABELS, 30, 0.01, seed=0, options=SplitOptions(min_samples_per_client=1))
    labels = np.array([0, 0, 0, 1])  # class 1 has a single sample for its two holders
    with pytest.raises(ValueError, match=r"client \d received only .*fewer clients"):
        shard_partition(labels, 4, 1, seed=0, options=SplitOptions(min_samples_per_client=1))


def test_ood_fraction_outside_unit_interval_and_an_empty_pool():
    part = make_partition(
        "dirichlet",
        LABELS,
        2,
        0,
        alpha=100.0,
        options=SplitOptions(min_samples_per_client=1),
        ood_pool_fraction=0.2,
    )
    client = part.clients[0]
    for p_ood in (-0.1, 1.5):
        with pytest.raises(ValueError, match="p must be in"):
            ood_test_indices(client, LABELS, part.ood_pool, p_ood, seed=0)
    assert client.classes == (0, 1, 2, 3)  # holds every class: nothing is OOD for it
    with pytest.raises(ValueError, match="client 0: the OOD pool holds no sample outside"):
        ood_test_indices(client, LABELS, part.ood_pool, 0.2, seed=0)
    indices, is_ood = ood_test_indices(client, LABELS, part.ood_pool, 0.0, seed=0)
    assert np.array_equal(indices, client.test) and not is_ood.any()
