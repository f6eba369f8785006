import pytest
from hypothesis import given
from hypothesis import strategies as st

from harmony_mobile.protocol.label_tokens import (
    TOKEN_BYTES,
    check_label_epoch,
    class_token,
    class_tokens,
    epoch_key,
    parse_slot_table,
    slot_classes,
    tokens_to_groups,
)

SECRET = bytes(range(32))


def test_other_secret_gives_other_tokens():
    assert len(class_token(epoch_key(SECRET, "e1"), "3")) == TOKEN_BYTES
    assert class_token(epoch_key(SECRET, "e1"), "3") != class_token(epoch_key(b"x" * 32, "e1"), "3")


def test_groups_carry_no_class_identity():
    tokens = class_tokens(epoch_key(SECRET, "e7"), ["5", "9", "5", "2", "9"])
    assert tokens_to_groups(tokens) == [0, 1, 0, 2, 1]  # first-seen order, not class ids


# --------------------------------------------------------------------------- label epochs and slots

EPOCHS = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)
NAMES = st.text(min_size=1, max_size=20)


@given(st.lists(NAMES, min_size=1, max_size=20), EPOCHS)
def test_equal_class_names_in_one_epoch_give_equal_tokens_across_clients(names, epoch):
    client_a = class_tokens(epoch_key(SECRET, epoch), names)
    client_b = class_tokens(epoch_key(bytes(SECRET), epoch), names)
    assert client_a == client_b
    for i in range(len(names)):
        for j in range(len(names)):
            assert (client_a[i] == client_a[j]) == (names[i] == names[j])


@given(NAMES, EPOCHS, EPOCHS)
def test_epochs_are_unlinkable(name, epoch, other):
    if epoch != other:
        assert class_token(epoch_key(SECRET, epoch), name) != class_token(epoch_key(SECRET, other), name)


@pytest.mark.parametrize("epoch", ["", "a b", "x" * 65, "é", "e/1", "7\n", None, 7])
def test_bad_label_epochs_are_rejected(epoch):
    with pytest.raises(ValueError, match="label epoch"):
        check_label_epoch(epoch)
    if isinstance(epoch, str):
        with pytest.raises(ValueError, match="label epoch"):
            epoch_key(SECRET, epoch)


def test_epoch_key_refuses_a_short_secret_and_empty_class_names():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        epoch_key(b"short", "e1")
    with pytest.raises(ValueError, match="non-empty"):
        class_token(epoch_key(SECRET, "e1"), "")


def test_slot_classes_names_known_slots_and_leaves_the_rest_unnamed():
    key = epoch_key(SECRET, "e1")
    names = ["cat", "dog", "bird"]
    foreign = class_token(epoch_key(SECRET, "e2"), "dog")  # right name, other epoch
    table = [class_token(key, "bird"), bytes(8), foreign, class_token(key, "cat")]
    assert slot_classes(key, names, table) == ["bird", None, None, "cat"]
    assert slot_classes(key, names, []) == []


def test_slot_tables_parse_from_lowercase_hex_only():
    assert parse_slot_table(["0123456789abcdef"]) == [bytes.fromhex("0123456789abcdef")]
    for bad in (["0123456789ABCDEF"], ["0123"], [7], ["0123456789abcdeg"]):
        with pytest.raises(ValueError, match="slot 0"):
            parse_slot_table(bad)
