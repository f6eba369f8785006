"""The training messages of protocol/messages.py as Flower records, and back.

One generic mapping for every message dataclass, so a field added to a message travels without
a change here: a tensor field goes to an ArrayRecord under its own name, a tensor dict (weights)
to an ArrayRecord `<field>`, float metric dicts to a MetricRecord `<field>`, and every other field
(strings, ints, floats, bytes, tuples of them) to the ConfigRecord `fields`. The ConfigRecord
`message` names the type, so a receiver rejects a record of the wrong kind instead of guessing.
"""

from __future__ import annotations

import dataclasses
import typing

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from harmony_mobile.protocol import messages

MESSAGE_TYPES = {cls.__name__: cls for cls in (*messages.SERVER_BOUND, *messages.CLIENT_BOUND)}
TYPE_RECORD = "message"
FIELDS_RECORD = "fields"
TENSOR_FIELDS_RECORD = "tensor_fields"  # name -> the ArrayRecord key of a lone tensor field
EMPTY_TUPLES = "empty_tuples"  # a ConfigRecord cannot hold an empty list; these fields were ()


class RecordError(ValueError):
    """A record that is not the message it claims to be (wrong type, missing or extra fields)."""


def tensor_dict_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    # contiguous CPU copies: ArrayRecord serializes through numpy
    return ArrayRecord(torch_state_dict={n: v.detach().cpu().contiguous() for n, v in tensors.items()})


def record_to_tensor_dict(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return dict(record.to_torch_state_dict())


def message_to_record(message) -> RecordDict:
    """Any message dataclass of protocol/messages.py as a RecordDict."""
    name = type(message).__name__
    if name not in MESSAGE_TYPES:
        raise RecordError(f"{name} is not a message of protocol/messages.py")
    records: dict = {TYPE_RECORD: ConfigRecord({"type": name})}
    fields, empty, lone_tensors = {}, [], []
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if isinstance(value, torch.Tensor):
            records[field.name] = tensor_dict_to_record({field.name: value})
            lone_tensors.append(field.name)
        elif (
            isinstance(value, dict)
            and all(isinstance(v, torch.Tensor) for v in value.values())
            and (value or _is_tensor_dict(type(message), field.name))
        ):
            records[field.name] = tensor_dict_to_record(value)
        elif isinstance(value, dict):
            records[field.name] = MetricRecord({k: float(v) for k, v in value.items()})
        elif isinstance(value, tuple):
            if value:
                fields[field.name] = list(value)
            else:
                empty.append(field.name)
        else:
            fields[field.name] = value
    fields[TENSOR_FIELDS_RECORD] = lone_tensors or [""]
    fields[EMPTY_TUPLES] = empty or [""]
    records[FIELDS_RECORD] = ConfigRecord(fields)
    return RecordDict(records)


def record_to_message(record: RecordDict, expected: type | None = None):
    """The message a RecordDict holds; `expected` rejects any other type."""
    if TYPE_RECORD not in record.config_records:
        raise RecordError("record names no message type")
    name = record.config_records[TYPE_RECORD]["type"]
    cls = MESSAGE_TYPES.get(str(name))
    if cls is None or (expected is not None and cls is not expected):
        wanted = expected.__name__ if expected else "a message of protocol/messages.py"
        raise RecordError(f"expected {wanted}, got {name!r}")
    fields = dict(record.config_records[FIELDS_RECORD])
    lone_tensors = [n for n in fields.pop(TENSOR_FIELDS_RECORD) if n]
    empty = [n for n in fields.pop(EMPTY_TUPLES) if n]
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in lone_tensors:
            values[field.name] = record_to_tensor_dict(record.array_records[field.name])[field.name]
        elif field.name in record.array_records:
            values[field.name] = record_to_tensor_dict(record.array_records[field.name])
        elif field.name in record.metric_records:
            values[field.name] = {k: float(v) for k, v in record.metric_records[field.name].items()}
        elif field.name in empty:
            values[field.name] = ()
        elif field.name in fields:
            value = fields.pop(field.name)
            values[field.name] = tuple(value) if typing.get_origin(hints[field.name]) is tuple else value
        else:
            raise RecordError(f"{name} record lacks field {field.name!r}")
    if fields:
        raise RecordError(f"{name} record has unknown fields {sorted(fields)}")
    return cls(**values)


def _is_tensor_dict(cls: type, field_name: str) -> bool:
    """An empty dict is a tensor dict if the field is declared as dict[str, torch.Tensor]."""
    hint = typing.get_type_hints(cls)[field_name]
    args = typing.get_args(hint)
    return len(args) == 2 and args[1] is torch.Tensor
