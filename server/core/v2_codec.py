"""Infer request and response bodies of the Open Inference Protocol (KServe V2) over HTTP.

Three request forms reach the same model (`request_form` tells them apart):
  * V2 binary tensor extension: `Inference-Header-Content-Length: H`, the first H bytes are the JSON
    request, each input with `parameters.binary_data_size` takes its raw little-endian bytes from
    the rest in input order. That header is what marks this form, whatever the Content-Type;
  * V2 JSON: no such header, `Content-Type: application/json`, none (tritonclient's blocking client
    sends none) or `application/octet-stream` with a body that starts with `{` (aiohttp, so
    tritonclient's asyncio client, labels every bytes body that way);
  * HMFT (`application/octet-stream`, no such header, a body not starting with `{`): our compact
    format (docs/PROTOCOL.md section 5) that phones send. Its magic "HMFT" is never JSON.
Bodies may be gzip/deflate compressed (`Content-Encoding`); responses honour requested outputs,
`binary_data` / `binary_data_output` and `Accept-Encoding: gzip`.
Every failure raises `InferBodyError` with the status it deserves (400 layout, 415 media, 422 values).
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field

import numpy as np
import orjson
from harmony_mobile.server.core.schemas import InferRequest
from pydantic import ValidationError

from harmony_mobile.protocol.validation import validation_problems
from harmony_mobile.protocol.wire import WireFormatError, decode_tensor

INPUT_NAME = "features"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LENGTH = "inference-header-content-length"
# request forms (`request_form`)
JSON_FORM, EXTENSION_FORM, HMFT_FORM = "json", "binary-extension", "hmft"
# JSON may open with whitespace (RFC 8259); an infer request is an object, so "{" comes next
JSON_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")
WIRE_DTYPES = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8")}


class InferBodyError(ValueError):
    def __init__(self, status_code: int, message: str):
        self.status_code = status_code
        super().__init__(message)


@dataclass(frozen=True)
class OutputTensor:
    """One named result tensor; the codec turns a list of these into either response form."""

    name: str
    datatype: str  # a key of WIRE_DTYPES
    array: np.ndarray


@dataclass
class ParsedInfer:
    features: np.ndarray  # (N, ...) float32, not yet checked against the model
    request_id: str | None = None
    tier: object = None
    requested: list[str] | None = None  # output names in the order asked; None = all
    binary_outputs: set[str] = field(default_factory=set)
    binary_by_default: bool = False


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding, never inflating past `limit` bytes (a small bomb must not cost memory)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InferBodyError(
            415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none"
        )
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise InferBodyError(400, f"body is not valid {encoding} data: {error}") from None
    if len(out) > limit:
        raise InferBodyError(413, f"decompressed body exceeds the limit of {limit} bytes (max_body_bytes)")
    if not inflater.eof:
        raise InferBodyError(400, f"body is truncated {encoding} data")
    return out


def request_form(content_type: str, header_length: str | None, body: bytes) -> str:
    """JSON_FORM, EXTENSION_FORM or HMFT_FORM (module docstring); 415 for any other Content-Type."""
    if header_length is not None:
        return EXTENSION_FORM
    if content_type not in ("", JSON_TYPE, BINARY_TYPE):
        raise InferBodyError(
            415,
            f"content type {content_type!r} is not accepted; send {JSON_TYPE} (or none) or {BINARY_TYPE}",
        )
    if content_type == BINARY_TYPE and not JSON_OBJECT_START.match(body):
        return HMFT_FORM
    return JSON_FORM


def parse_request(content_type: str, header_length: str | None, body: bytes) -> ParsedInfer:
    form = request_form(content_type, header_length, body)
    if form == EXTENSION_FORM:
        return _parse_binary_extension(header_length, body)
    if form == HMFT_FORM:
        try:
            return ParsedInfer(decode_tensor(body))
        except WireFormatError as error:
            raise InferBodyError(400, f"malformed binary body: {error}") from None
    return _parse_json(body, b"")


def _parse_binary_extension(header_length: str, body: bytes) -> ParsedInfer:
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise InferBodyError(
            400, f"Inference-Header-Content-Length {header_length!r} is not an integer in 0..{len(body)}"
        )
    return _parse_json(body[:length], body[length:])


def _parse_json(header: bytes, binary: bytes) -> ParsedInfer:
    try:
        request = InferRequest.model_validate_json(header)
    except ValidationError as error:
        problems = validation_problems(error.errors(), whole="body")
        raise InferBodyError(422, f"invalid infer request: {problems}") from None
    if len(request.inputs) != 1:
        raise InferBodyError(
            422, f"expected exactly one input named {INPUT_NAME!r}, got {len(request.inputs)}"
        )
    parameters = request.parameters or {}
    parsed = ParsedInfer(
        features=_input_array(request, binary),
        request_id=request.id,
        tier=parameters.get("tier"),
        binary_by_default=_flag(parameters, "binary_data_output"),
    )
    if request.outputs is not None:
        parsed.requested = [o.name for o in request.outputs]
        for output in request.outputs:
            if _flag(output.parameters or {}, "binary_data", parsed.binary_by_default):
                parsed.binary_outputs.add(output.name)
    return parsed


def _flag(parameters: dict, name: str, default: bool = False) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InferBodyError(422, f"parameter {name!r} must be true or false, got {value!r}")
    return value


def _input_array(request: InferRequest, binary: bytes) -> np.ndarray:
    tensor = request.inputs[0]
    if tensor.name != INPUT_NAME:
        raise InferBodyError(
            422, f"unknown input {tensor.name!r}; this model's input is named {INPUT_NAME!r}"
        )
    if tensor.datatype != "FP32":
        raise InferBodyError(
            422, f"input {INPUT_NAME!r} has datatype {tensor.datatype!r}; this model accepts 'FP32' only"
        )
    if not tensor.shape or any(d < 1 for d in tensor.shape):
        raise InferBodyError(
            422, f"input {INPUT_NAME!r} has shape {tensor.shape}; every dimension must be >= 1"
        )
    expected = math.prod(tensor.shape)
    binary_size = (tensor.parameters or {}).get("binary_data_size")
    if binary_size is not None:
        values = _binary_values(binary, binary_size, expected)
    elif binary:
        raise InferBodyError(
            400, f"{len(binary)} bytes follow the JSON header but no input has binary_data_size"
        )
    elif tensor.data is None:
        raise InferBodyError(422, f"input {INPUT_NAME!r} has neither data nor parameters.binary_data_size")
    else:
        values = _json_values(tensor.data)
    if values.size != expected:
        raise InferBodyError(
            422, f"input {INPUT_NAME!r} holds {values.size} values; shape {tensor.shape} needs {expected}"
        )
    return values.reshape(tensor.shape)


def _binary_values(binary: bytes, size: object, expected: int) -> np.ndarray:
    if type(size) is not int or size != len(binary):
        raise InferBodyError(
            400, f"binary_data_size {size!r} does not match the {len(binary)} bytes after the JSON header"
        )
    if size != 4 * expected:
        raise InferBodyError(
            422, f"input {INPUT_NAME!r} has {size} bytes; FP32 of its shape needs {4 * expected}"
        )
    return np.frombuffer(binary, dtype="<f4")


def _json_values(data: list) -> np.ndarray:
    try:
        return np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError, OverflowError):  # OverflowError: an integer such as 10**400
        raise InferBodyError(
            422, f"input {INPUT_NAME!r} data must be finite numbers (flat, or nested lists of equal length)"
        ) from None


def check_requested(names: list[str], requested: list[str] | None) -> None:
    unknown = [name for name in requested or () if name not in names]
    if unknown:
        raise InferBodyError(
            422, f"unknown output {unknown[0]!r}; this model's outputs are {', '.join(names)}"
        )


def select_outputs(outputs: list[OutputTensor], requested: list[str] | None) -> list[OutputTensor]:
    if requested is None:
        return outputs
    check_requested([o.name for o in outputs], requested)
    by_name = {o.name: o for o in outputs}
    return [by_name[name] for name in dict.fromkeys(requested)]


def encode_response(
    model_name: str, model_version: str, parsed: ParsedInfer, outputs: list[OutputTensor]
) -> tuple[bytes, dict[str, str]]:
    """The body and its headers: plain JSON, or JSON + raw tensors when any output is binary."""
    binary_names = set(parsed.binary_outputs)
    if parsed.requested is None and parsed.binary_by_default:
        binary_names = {o.name for o in outputs}
    described, raw = [], []
    for output in outputs:
        entry = {"name": output.name, "datatype": output.datatype, "shape": list(output.array.shape)}
        if output.name in binary_names:
            data = np.ascontiguousarray(output.array, dtype=WIRE_DTYPES[output.datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = output.array.ravel().tolist()
        described.append(entry)
    document = {"model_name": model_name, "model_version": model_version, "outputs": described}
    if parsed.request_id is not None:
        document["id"] = parsed.request_id
    # orjson writes this compact JSON in a tenth of json.dumps's time, a large share of a 1-row
    # request; it would write NaN as null, but the infer route answers non-finite outputs with a 422
    header = orjson.dumps(document)
    if not raw:
        return header, {"content-type": JSON_TYPE}
    headers = {"content-type": BINARY_TYPE, "Inference-Header-Content-Length": str(len(header))}
    return header + b"".join(raw), headers


def _quality(parameters: list[str]) -> float:
    """The q value of one Accept-Encoding entry (1 when absent; 0 when it is not a number)."""
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header (RFC 9110 12.5.3) accepts gzip: named (or as x-gzip) with
    a q above 0, or covered by `*` with a q above 0 when not named; `gzip;q=0` refuses it."""
    qualities: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        coding, *parameters = entry.split(";")
        coding = coding.strip().lower()
        if coding:
            qualities[coding] = _quality(parameters)
    named = [qualities[c] for c in ("gzip", "x-gzip") if c in qualities]
    if named:
        return max(named) > 0
    return qualities.get("*", 0.0) > 0


def maybe_gzip(body: bytes, headers: dict[str, str], accept_encoding: str) -> bytes:
    if accepts_gzip(accept_encoding):
        headers["Content-Encoding"] = "gzip"
        return gzip.compress(body, compresslevel=1)
    return body
