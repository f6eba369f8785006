"""V2 conformance with a standard client: tritonclient's HTTP clients (tritonclient[http], the
blocking one and the asyncio one, `tritonclient.http.aio`), unchanged, against a real `harmony serve`
process. Health, metadata, config, statistics, repository index and
infer (JSON and the binary tensor extension, requested outputs, binary outputs, gzip both ways),
auth through `headers=`, and errors decoded from the V2 `{"error": ...}` body.

Every call gets a fresh headers dict: tritonclient writes Inference-Header-Content-Length into the
dict it is given, so reusing one would send a stale header length with the next request."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from harmony_mobile.run_dir import load_backend_file
from tests.helpers.fallback_server import ADMIN, class_features, make_model_dir
from tests.server_process import serve

torch.set_num_threads(1)
MODEL = "harmony-backend"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(host:port, auth headers of an enrolled device, model dir) of one server for the module."""
    root = tmp_path_factory.mktemp("triton")
    model_dir = make_model_dir(root)
    with serve(root / "data", model_dir) as base_url:
        import httpx

        device = httpx.post(f"{base_url}/v1/devices", json={"tier": "mid-android"}, headers=ADMIN).json()
        yield base_url.removeprefix("http://"), {"Authorization": f"Bearer {device['token']}"}, model_dir


@pytest.fixture(scope="module")
def served(server):
    address, auth, model_dir = server
    client = triton.InferenceServerClient(address, network_timeout=30)
    yield client, auth, model_dir
    client.close()


def expected_outputs(model_dir, x: np.ndarray) -> dict[str, np.ndarray]:
    backend = load_backend_file(model_dir / "backend" / "backend.pt").backend.eval()
    with torch.inference_mode():
        slot_scores = backend(torch.from_numpy(x))
        confidence, top_slot = torch.softmax(slot_scores, dim=1).max(dim=1)
    return {
        "slot_scores": slot_scores.numpy(),
        "top_slot": top_slot.numpy(),
        "confidence": confidence.numpy(),
    }


def features_input(x: np.ndarray, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def test_health_and_metadata(served):
    client, auth, _ = served
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready(MODEL, headers={**auth}) and client.is_model_ready(
        MODEL, "v1", headers={**auth}
    )
    metadata = client.get_model_metadata(MODEL, headers={**auth})
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 64, 8, 8]}]
    assert [o["name"] for o in metadata["outputs"]] == ["slot_scores", "top_slot", "confidence"]


def test_config_statistics_and_repository_index(served):
    client, auth, _ = served
    config = client.get_model_config(MODEL, headers={**auth})
    assert config["input"] == [{"name": "features", "data_type": "TYPE_FP32", "dims": [64, 8, 8]}]
    client.infer(MODEL, [features_input(class_features(np.array([1, 2]), 0), True)], headers={**auth})
    stats = client.get_inference_statistics(MODEL, headers={**auth})["model_stats"]
    assert stats[0]["version"] == "v1" and stats[0]["inference_count"] >= 2
    assert stats[0]["inference_stats"]["success"]["count"] >= 1
    index = client.get_model_repository_index(headers={**auth})
    assert index == [{"name": MODEL, "version": "v1", "state": "READY"}]


@pytest.mark.parametrize("binary_input", [False, True], ids=["json-input", "binary-input"])
@pytest.mark.parametrize("binary_output", [False, True], ids=["json-output", "binary-output"])
def test_infer_matches_the_backend(served, binary_input, binary_output):
    client, auth, model_dir = served
    x = class_features(np.array([0, 3, 7]), seed=4)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary_output) for n in ("slot_scores", "top_slot")]
    result = client.infer(
        MODEL, [features_input(x, binary_input)], outputs=outputs, headers={**auth}, request_id="req-1"
    )
    expected = expected_outputs(model_dir, x)
    np.testing.assert_allclose(result.as_numpy("slot_scores"), expected["slot_scores"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("top_slot"), expected["top_slot"])
    assert result.as_numpy("confidence") is None  # not requested, not sent
    response = result.get_response()
    assert response["id"] == "req-1" and response["model_version"] == "v1"


def test_default_outputs_are_all_binary(served):
    client, auth, model_dir = served
    x = class_features(np.array([5]), seed=1)
    result = client.infer(MODEL, [features_input(x, True)], headers={**auth})
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    np.testing.assert_allclose(
        result.as_numpy("confidence"), expected_outputs(model_dir, x)["confidence"], rtol=1e-5
    )


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(served, algorithm):
    client, auth, model_dir = served
    x = class_features(np.array([2, 9]), seed=6)
    result = client.infer(
        MODEL,
        [features_input(x, True)],
        model_version="v1",
        headers={**auth},
        request_compression_algorithm=algorithm,
        response_compression_algorithm="gzip",
    )
    np.testing.assert_array_equal(result.as_numpy("top_slot"), expected_outputs(model_dir, x)["top_slot"])


def test_errors_carry_the_v2_error_message(served):
    client, auth, _ = served
    x = class_features(np.array([1]), seed=0)
    with pytest.raises(InferenceServerException) as unauthorized:
        client.infer(MODEL, [features_input(x, True)], headers={"Authorization": "Bearer wrong"})
    assert unauthorized.value.status() == "401" and "unknown bearer token" in unauthorized.value.message()
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("other-model", headers={**auth})
    assert unknown.value.status() == "404" and "unknown model 'other-model'" in unknown.value.message()
    wrong_shape = class_features(np.array([1]), seed=0)[:, :32]
    with pytest.raises(InferenceServerException) as invalid:
        client.infer(MODEL, [features_input(np.ascontiguousarray(wrong_shape), True)], headers={**auth})
    assert invalid.value.status() == "422" and "expected [N, 64, 8, 8]" in invalid.value.message()
    with pytest.raises(InferenceServerException) as no_output:
        client.infer(
            MODEL,
            [features_input(x, False)],
            outputs=[triton.InferRequestedOutput("probs")],
            headers={**auth},
        )
    assert "unknown output 'probs'" in no_output.value.message()


# ---------------------------------------------------------------- the asyncio client
# tritonclient.http.aio posts through aiohttp, which labels every bytes body
# application/octet-stream: a JSON request then arrives with that type and no
# Inference-Header-Content-Length, unlike the blocking client's (no Content-Type at all).


async def aio_infer(address: str, auth: dict, x: np.ndarray, binary_input: bool, binary_output: bool):
    async with triton_aio.InferenceServerClient(address, conn_timeout=30) as client:
        assert await client.is_server_ready()
        outputs = [
            triton_aio.InferRequestedOutput(n, binary_data=binary_output) for n in ("slot_scores", "top_slot")
        ]
        return await client.infer(
            MODEL, [features_input(x, binary_input)], outputs=outputs, headers={**auth}, request_id="aio"
        )


@pytest.mark.parametrize("binary_input", [False, True], ids=["json-input", "binary-input"])
@pytest.mark.parametrize("binary_output", [False, True], ids=["json-output", "binary-output"])
def test_aio_client_infer_matches_the_backend(server, binary_input, binary_output):
    address, auth, model_dir = server
    x = class_features(np.array([1, 4, 8]), seed=9)
    result = asyncio.run(aio_infer(address, auth, x, binary_input, binary_output))
    expected = expected_outputs(model_dir, x)
    np.testing.assert_allclose(result.as_numpy("slot_scores"), expected["slot_scores"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("top_slot"), expected["top_slot"])
    assert result.get_response()["id"] == "aio" and result.as_numpy("confidence") is None


def test_aio_client_reads_v2_errors(server):
    address, _, _ = server
    x = class_features(np.array([1]), seed=0)

    async def unauthorized() -> None:
        async with triton_aio.InferenceServerClient(address, conn_timeout=30) as client:
            await client.infer(MODEL, [features_input(x, False)], headers={"Authorization": "Bearer wrong"})

    with pytest.raises(InferenceServerException) as error:
        asyncio.run(unauthorized())
    assert error.value.status() == "401" and "unknown bearer token" in error.value.message()
