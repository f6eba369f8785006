import pytest
from hypothesis import given
from hypothesis import strategies as st

from harmony_mobile.privacy.label_tokens import (
    TOKEN_BYTES,
    label_token,
    label_tokens,
    round_key,
    tokens_to_groups,
)

SECRET = bytes(range(32))


@given(st.lists(st.integers(0, 99), min_size=1, max_size=30), st.integers(0, 10_000))
def test_equal_labels_in_one_round_give_equal_tokens_across_clients(labels, round_id):
    # two clients derive the round key independently from the shared federation secret
    client_a = label_tokens(round_key(SECRET, round_id), labels)
    client_b = label_tokens(round_key(bytes(SECRET), round_id), labels)
    assert client_a == client_b
    for i, j in [(i, j) for i in range(len(labels)) for j in range(len(labels))]:
        assert (client_a[i] == client_a[j]) == (labels[i] == labels[j])


@given(st.integers(0, 99), st.integers(0, 10_000))
def test_tokens_change_across_rounds(class_id, round_id):
    assert label_token(round_key(SECRET, round_id), class_id) != label_token(
        round_key(SECRET, round_id + 1), class_id
    )


@given(st.integers(0, 999), st.integers(0, 1000))
def test_no_token_equals_a_class_id(class_id, round_id):
    token = label_token(round_key(SECRET, round_id), class_id)
    assert len(token) == TOKEN_BYTES
    for encoding in ("big", "little"):
        assert int.from_bytes(token, encoding) >= 1000 or int.from_bytes(token, encoding) != class_id
    assert token != class_id.to_bytes(TOKEN_BYTES, "big")


def test_other_secret_gives_other_tokens():
    assert label_token(round_key(SECRET, 1), 3) != label_token(round_key(b"x" * 32, 1), 3)


def test_groups_carry_no_class_identity():
    key = round_key(SECRET, 7)
    tokens = label_tokens(key, [5, 9, 5, 2, 9])
    assert tokens_to_groups(tokens) == [0, 1, 0, 2, 1]  # first-seen order, not class ids


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        round_key(b"short", 1)
    with pytest.raises(ValueError, match="non-negative"):
        label_token(round_key(SECRET, 1), -1)
