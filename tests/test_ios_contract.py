"""The Swift sources of ios_demo agree with the Python side, checked without a Swift toolchain.

There is no Swift compiler on the Linux CI, so HarmonyKit's XCTests (byte equality on tests/vectors)
run only on a Mac. This test reads the Swift sources as text and checks that every name and number
the phone and the Python code must share is the same on both sides: the Core ML / .pte input and
output names, the binary layouts (HMFT, HMUP, HMSE magics, versions, dtype code, header sizes),
HKDF info strings, key / nonce / tag sizes, label-token parameters, manifest file names and schema
keys, the upload metadata key order, endpoint paths and headers, the ExecuTorch version, and the
Xcode project's references. A rename on either side fails here instead of on a phone.

Python values come from the sources through `ast` (no torch import), from server/openapi.json and
from docs/PROTOCOL.md, so the test stays fast.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import plistlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IOS = ROOT / "ios_demo"
KIT = IOS / "HarmonyKit"
SOURCES = KIT / "Sources" / "HarmonyKit"
TESTS = KIT / "Tests" / "HarmonyKitTests"
ET_PACKAGE = IOS / "HarmonyKitExecuTorch"
APP = IOS / "HarmonyDemo"
PBXPROJ = APP / "HarmonyDemo.xcodeproj" / "project.pbxproj"
PROTOCOL = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
OPENAPI = json.loads((ROOT / "server" / "openapi.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- reading Swift


def _swift_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.swift"))


ALL_SWIFT = _swift_files(KIT, ET_PACKAGE, APP)
TOP_TYPE = re.compile(
    r"^(?:public |private |internal |fileprivate )?(?:final )?(?:struct|enum|class|actor) (\w+)"
)
STATIC_LET = re.compile(
    r"^\s*(?:public |internal |private |fileprivate )?(?:nonisolated )?static let (\w+)(?:: [^=]+)? = (.+?)\s*$"
)


def _constants() -> dict[tuple[str, str], str]:
    """(top-level type, name) -> the source text of every `static let` initializer in HarmonyKit."""
    found: dict[tuple[str, str], str] = {}
    for path in _swift_files(SOURCES):
        owner = None
        lines = iter(path.read_text(encoding="utf-8").splitlines())
        for line in lines:
            while "static let" in line and line.count("[") > line.count("]"):  # continued literal
                line += " " + next(lines).strip()
            if match := TOP_TYPE.match(line):
                owner = match.group(1)
            elif (match := STATIC_LET.match(line)) and owner is not None:
                key = (owner, match.group(1))
                assert key not in found, f"{key} declared twice"
                found[key] = match.group(2)
    return found


CONSTANTS = _constants()


def swift(owner: str, name: str):
    """The value of a Swift `static let` literal: int, str, bytes, list, set or (method, path)."""
    key = (owner, name)
    assert key in CONSTANTS, f"ios_demo: no `static let {name}` in {owner} (renamed?)"
    return _literal(owner, CONSTANTS[key])


def _literal(owner: str, text: str):
    text = text.strip()
    if match := re.fullmatch(r'(?:Array|Data)\("((?:[^"\\]|\\.)*)"\.utf8\)', text):
        return json.loads(f'"{match.group(1)}"').encode("utf-8")
    if re.fullmatch(r'"(?:[^"\\]|\\.)*"', text):
        return json.loads(text)
    if re.fullmatch(r"0x[0-9a-fA-F_]+|[0-9][0-9_]*", text):
        return int(text.replace("_", ""), 0)
    if match := re.fullmatch(r'Endpoint\(method: "(\w+)", path: "([^"]+)"\)', text):
        return match.group(1), match.group(2)
    if text.startswith("[") and text.endswith("]"):
        items = [i.strip() for i in re.findall(r'"[^"]*"|[^,\s][^,]*', text[1:-1])]
        return [_literal(owner, item) for item in items if item]
    if re.fullmatch(r"\w+", text) and (owner, text) in CONSTANTS:
        return _literal(owner, CONSTANTS[(owner, text)])
    if match := re.fullmatch(r"(\w+)\.(\w+)", text):
        return swift(match.group(1), match.group(2))
    raise AssertionError(f"cannot read the Swift literal {text!r} of {owner}")


def _swift_text(*paths: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def _type_members(path: Path, type_name: str) -> tuple[str, str]:
    """(own CodingKeys body, own member lines) of `type_name`: members one indentation level inside it."""
    text = path.read_text(encoding="utf-8")
    start = re.search(rf"^( *)(?:public |private )?(?:final )?(?:struct|class) {type_name}\b", text, re.M)
    assert start, f"{path.name}: no type {type_name}"
    inner = start.group(1) + "    "
    rest = text[start.end() :]
    enum = re.search(rf"^{inner}enum CodingKeys: String, CodingKey {{\n(.*?)^{inner}}}", rest, re.M | re.S)
    assert enum, f"{path.name}: {type_name} has no CodingKeys"
    members = re.findall(rf"^{inner}(public let \w+: [^\n=]+|let \w+: [^\n=]+)", rest[: enum.start()], re.M)
    return enum.group(1), "\n".join(members)


def _coding_keys(path: Path, type_name: str) -> dict[str, str]:
    """Swift property -> JSON key, from the `enum CodingKeys` of `type_name`."""
    body, _ = _type_members(path, type_name)
    return {name: raw or name for name, raw in re.findall(r'case (\w+)(?: = "([^"]+)")?', body)}


def _swift_optionals(path: Path, type_name: str) -> dict[str, bool]:
    """Stored `let` property of `type_name` -> is it Optional."""
    _, members = _type_members(path, type_name)
    return {name: kind.strip().endswith("?") for name, kind in re.findall(r"let (\w+): ([^\n]+)", members)}


# --------------------------------------------------------------------------- reading Python


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _module_constants(path: Path) -> dict[str, object]:
    """Module-level NAME = <expression of literals, names and len()> of a Python source file."""
    namespace: dict[str, object] = {}
    for node in _module(path).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = eval(  # noqa: S307 - literals of our own sources, no builtins but len
                    compile(ast.Expression(node.value), str(path), "eval"),
                    {"__builtins__": {"len": len}},
                    namespace,
                )
            except Exception:  # noqa: BLE001 - not a constant expression
                continue
            namespace[node.targets[0].id] = value
    return namespace


def _pydantic_fields(path: Path, class_name: str) -> dict[str, ast.AnnAssign]:
    """Field name -> its annotated assignment, in declaration order."""
    for node in _module(path).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {
                stmt.target.id: stmt
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            }
    raise AssertionError(f"{path.name} has no class {class_name}")


def _literal_values(annotation: ast.expr) -> list[str]:
    """The strings of a `Literal["a", "b"]` annotation."""
    assert isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Literal"
    inner = annotation.slice
    elements = inner.elts if isinstance(inner, ast.Tuple) else [inner]
    return [e.value for e in elements]


def _field_keyword(field: ast.AnnAssign, keyword: str):
    assert isinstance(field.value, ast.Call), ast.unparse(field)
    for kw in field.value.keywords:
        if kw.arg == keyword:
            return ast.literal_eval(kw.value)
    raise AssertionError(f"{ast.unparse(field)} has no {keyword}=")


WIRE = _module_constants(ROOT / "harmony_mobile" / "protocol" / "wire.py")
SEALING = _module_constants(ROOT / "harmony_mobile" / "protocol" / "sealing.py")
LABEL_TOKENS_PY = ROOT / "harmony_mobile" / "protocol" / "label_tokens.py"
LABEL_TOKENS = _module_constants(LABEL_TOKENS_PY)
COREML = _module_constants(ROOT / "export" / "coreml.py")
MANIFEST_PY = ROOT / "export" / "manifest.py"
MANIFEST = _module_constants(MANIFEST_PY)
KEYS = _module_constants(ROOT / "export" / "keys.py")
TIERS = _module_constants(ROOT / "harmony_mobile" / "models" / "tiers.py")


# --------------------------------------------------------------------------- binary layouts


def test_feature_tensor_layout_matches_wire_py_and_the_protocol():
    assert swift("FeatureTensor", "magic") == WIRE["TENSOR_MAGIC"]
    assert swift("FeatureTensor", "version") == WIRE["TENSOR_VERSION"]
    assert swift("FeatureTensor", "dtypeFloat32") == WIRE["DTYPE_FLOAT32"]
    assert swift("FeatureTensor", "maxNdim") == WIRE["MAX_NDIM"]
    assert swift("FeatureTensor", "fixedHeaderBytes") == WIRE["TENSOR_FIXED_HEADER"]
    magic = swift("FeatureTensor", "magic")
    assert f'magic "{magic.decode()}" ({magic.hex(" ")})' in PROTOCOL
    assert f"dtype code: 0x{swift('FeatureTensor', 'dtypeFloat32'):02x} = float32" in PROTOCOL
    assert f"ndim, 1..{swift('FeatureTensor', 'maxNdim')}" in PROTOCOL
    assert f"{swift('FeatureTensor', 'fixedHeaderBytes')}+4*ndim" in PROTOCOL


def test_upload_plaintext_layout_matches_wire_py_and_the_protocol():
    assert swift("UploadPlaintext", "magic") == WIRE["UPLOAD_MAGIC"]
    assert swift("UploadPlaintext", "version") == WIRE["UPLOAD_VERSION"]
    assert swift("UploadPlaintext", "fixedHeaderBytes") == WIRE["UPLOAD_FIXED_HEADER"]
    magic = swift("UploadPlaintext", "magic")
    assert f'magic "{magic.decode()}" ({magic.hex(" ")})' in PROTOCOL
    assert f"{swift('UploadPlaintext', 'fixedHeaderBytes')}+M" in PROTOCOL


def test_upload_metadata_keys_and_limits_match_the_pydantic_model():
    fields = _pydantic_fields(ROOT / "harmony_mobile" / "protocol" / "wire.py", "UploadMetadata")
    # The JSON bytes are compared against Python's, so the key order is part of the contract.
    assert swift("UploadMetadata", "jsonKeys") == list(fields)
    assert swift("UploadMetadata", "tierPattern") == _field_keyword(fields["tier"], "pattern")
    assert swift("UploadMetadata", "maxFamilyLength") == _field_keyword(fields["family"], "max_length")
    assert swift("UploadMetadata", "maxModelVersionLength") == _field_keyword(
        fields["model_version"], "max_length"
    )
    assert f"`{swift('UploadMetadata', 'tierPattern')}`" in PROTOCOL
    for key in swift("UploadMetadata", "jsonKeys"):
        assert f"| `{key}` |" in PROTOCOL, key


def test_sealing_constants_match_sealing_py_and_the_protocol():
    assert swift("UploadSealer", "magic") == SEALING["ENVELOPE_MAGIC"]
    assert swift("UploadSealer", "version") == SEALING["ENVELOPE_VERSION"]
    assert swift("UploadSealer", "keyBytes") == SEALING["KEY_BYTES"]
    assert swift("UploadSealer", "nonceBytes") == SEALING["NONCE_BYTES"]
    assert swift("UploadSealer", "tagBytes") == SEALING["TAG_BYTES"]
    assert swift("UploadSealer", "headerBytes") == SEALING["HEADER_BYTES"]
    assert swift("UploadSealer", "hkdfInfo").encode() == SEALING["HKDF_INFO"]
    assert swift("AssociatedData", "label").encode() == SEALING["AD_LABEL"]
    assert swift("AssociatedData", "maxDeviceIDBytes") == SEALING["MAX_DEVICE_ID_BYTES"]
    magic = swift("UploadSealer", "magic")
    assert f'magic "{magic.decode()}" ({magic.hex(" ")})' in PROTOCOL
    assert f'info = "{swift("UploadSealer", "hkdfInfo")}"' in PROTOCOL
    assert f'"{swift("AssociatedData", "label")}"' in PROTOCOL
    header, tag = swift("UploadSealer", "headerBytes"), swift("UploadSealer", "tagBytes")
    assert f"{header}+L" in PROTOCOL and f"Minimum envelope size: {header + tag} bytes" in PROTOCOL
    assert re.search(rf"\b{swift('UploadSealer', 'nonceBytes')}\s+AES-GCM nonce", PROTOCOL)


def test_label_token_constants_match_label_tokens_py_and_the_protocol():
    assert swift("LabelTokens", "tokenBytes") == LABEL_TOKENS["TOKEN_BYTES"]
    assert swift("LabelTokens", "epochKeyBytes") == LABEL_TOKENS["EPOCH_KEY_BYTES"]
    assert f"{{1,{swift('LabelTokens', 'maxLabelEpochLength')}}}" in LABEL_TOKENS["LABEL_EPOCH_PATTERN"]
    assert swift("LabelTokens", "infoPrefix").encode() == LABEL_TOKENS["INFO_PREFIX"]
    minimum = re.search(r"len\(federation_secret\) < (\d+)", LABEL_TOKENS_PY.read_text(encoding="utf-8"))
    assert swift("LabelTokens", "minSecretBytes") == int(minimum.group(1))
    assert f'"{swift("LabelTokens", "infoPrefix")}"' in PROTOCOL
    assert f"first {swift('LabelTokens', 'tokenBytes')} bytes of HMAC-SHA256" in PROTOCOL


def _swift_function(path: Path, signature: str) -> str:
    """The text of a Swift function, from `signature` to the closing brace at its indentation."""
    text = path.read_text(encoding="utf-8")
    start = re.search(rf"^( *)[^\n]*{re.escape(signature)}", text, re.M)
    assert start, f"{path.name}: no {signature}"
    end = re.compile(rf"^{start.group(1)}}}", re.M).search(text, start.end())
    return text[start.start() : end.end()]


def test_exit_outputs_are_named_through_the_token_order():
    """Exit heads ship in token order (label_tokens.py exit_order): HarmonyKit sorts the tokens as
    unsigned bytes, names the top exit output through that order everywhere, and its XCTests check
    tests/vectors/exit_order.json case by case, as they check slot_mapping.json."""
    assert "def exit_order(" in LABEL_TOKENS_PY.read_text(encoding="utf-8")
    order = _swift_function(SOURCES / "Crypto" / "LabelTokens.swift", "func exitOrder(classNames: [String])")
    assert "token(className:" in order and "lexicographicallyPrecedes" in order  # Data: UInt8, unsigned
    assert "Int8" not in order and "bitPattern" not in order
    client_file = SOURCES / "Client" / "HarmonyClient.swift"
    decoder = _swift_function(client_file, "public init(federationKey: FederationKey, labelEpoch: String")
    assert ".exitOrder(classNames:" in decoder
    classify = _swift_function(client_file, "public func classify(_ input: [Float])")
    assert "exits.classIndex(output: local.topOutput)" in classify
    assert "exitLogits.count == exits.outputs" in classify
    # No Swift file reads the exit head's top output as a class index.
    for path in ALL_SWIFT:
        if path.parent == TESTS:
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(
            r"predictedClass: local\.|local\.predictedClass|\(result\.local\.topOutput\)", text
        ), f"{path.relative_to(ROOT)} uses an exit output as a class"
    assert "ExitDecoder(" in (APP / "HarmonyDemo" / "DemoModel.swift").read_text(encoding="utf-8")
    golden = _swift_function(TESTS / "GoldenVectorTests.swift", "func testExitOrderEqualsPython()")
    assert 'Vectors.load("exit_order.json"' in golden
    for use in (
        "exitOrder(classNames: vector.classNames), vector.exitClasses",
        "ExitDecoder(",
        "classIndex(output:",
    ):
        assert use in golden, use
    vectors = json.loads((ROOT / "tests" / "vectors" / "exit_order.json").read_text(encoding="utf-8"))
    assert f"XCTAssertEqual(vectors.cases.count, {len(vectors['cases'])})" in golden
    assert "tests/vectors/exit_order.json" in PROTOCOL


# --------------------------------------------------------------------------- models and manifest


def test_front_end_names_match_the_exporters():
    assert swift("FrontEndContract", "inputName") == COREML["INPUT_NAME"]
    outputs = (swift("FrontEndContract", "logitsOutputName"), swift("FrontEndContract", "featuresOutputName"))
    assert outputs == COREML["OUTPUT_NAMES"]
    steps_py = ROOT / "export" / "steps.py"
    wrapper = next(
        node
        for node in _module(steps_py).body
        if isinstance(node, ast.ClassDef) and node.name == "ExitAndFeatures"
    )
    names = next(
        ast.literal_eval(stmt.value)
        for stmt in wrapper.body
        if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "output_names"
    )
    assert names == outputs, "export/steps.py ExitAndFeatures.output_names"
    steps = steps_py.read_text(encoding="utf-8")
    assert f'load_method("{swift("FrontEndContract", "pteMethodName")}")' in steps
    vectors = json.loads((ROOT / "tests" / "vectors" / "manifest_signature.json").read_text(encoding="utf-8"))
    manifest = json.loads(vectors["manifest_text"])
    for tier in manifest["tiers"]:
        assert tier["input"]["name"] == swift("FrontEndContract", "inputName")
        assert tuple(o["name"] for o in tier["outputs"]) == outputs
        assert tier["interface_shape"] == swift("FrontEndContract", "interfaceShape")
        assert tier["input"]["shape"][0] == 1 and len(tier["input"]["shape"]) == 4
    shape = swift("FrontEndContract", "interfaceShape")
    assert manifest["interface_shape"] == shape
    assert f"(N, {', '.join(map(str, shape))})" in PROTOCOL


def test_engines_use_the_contract_names_and_no_stray_literals():
    """The names live in FrontEndContract only, so a rename there reaches both engines."""
    contract = SOURCES / "Engine" / "InferenceEngine.swift"
    names = [
        swift("FrontEndContract", n)
        for n in ("inputName", "logitsOutputName", "featuresOutputName", "pteMethodName")
    ]
    for path in ALL_SWIFT:
        if path == contract or path.parent == TESTS:
            continue
        text = path.read_text(encoding="utf-8")
        for name in names:
            assert f'"{name}"' not in text, (
                f"{path.relative_to(ROOT)} spells {name!r} instead of FrontEndContract"
            )
    coreml = (SOURCES / "Engine" / "CoreMLEngine.swift").read_text(encoding="utf-8")
    for use in (
        "FrontEndContract.inputName",
        "FrontEndContract.logitsOutputName",
        "FrontEndContract.featuresOutputName",
    ):
        assert use in coreml
    for use in (
        "MLModel.compileModel(at:",
        "MLModel.load(contentsOf:",
        "MLDictionaryFeatureProvider",
        "MLMultiArray",
    ):
        assert use in coreml
    executorch = (ET_PACKAGE / "Sources" / "HarmonyKitExecuTorch" / "ExecuTorchEngine.swift").read_text(
        encoding="utf-8"
    )
    for use in (
        "import ExecuTorch",
        "Module(filePath:",
        "FrontEndContract.pteMethodName",
        "FrontEndContract.check(tier)",
    ):
        assert use in executorch


def test_manifest_constants_match_export_manifest_py():
    assert swift("ManifestVerifier", "manifestFile") == MANIFEST["MANIFEST_FILE"]
    assert swift("ManifestVerifier", "signatureFile") == MANIFEST["SIGNATURE_FILE"]
    assert swift("ManifestVerifier", "publicKeyFile") == KEYS["PUBLIC_KEY_FILE"]
    assert swift("ManifestVerifier", "p256SignatureFile") == MANIFEST["P256_SIGNATURE_FILE"]
    assert swift("ManifestVerifier", "p256PublicKeyFile") == KEYS["P256_PUBLIC_KEY_FILE"]
    p256_fields = _pydantic_fields(MANIFEST_PY, "P256SignatureInfo")
    assert [swift("ManifestVerifier", "p256SignatureAlgorithm")] == _literal_values(
        p256_fields["algorithm"].annotation
    )
    assert swift("ManifestVerifier", "supportedFormat") == MANIFEST["MANIFEST_FORMAT"]
    manifest_fields = _pydantic_fields(MANIFEST_PY, "Manifest")
    assert [swift("ManifestVerifier", "kind")] == _literal_values(manifest_fields["kind"].annotation)
    signature_fields = _pydantic_fields(MANIFEST_PY, "SignatureInfo")
    assert [swift("ManifestVerifier", "signatureAlgorithm")] == _literal_values(
        signature_fields["algorithm"].annotation
    )
    artifact = _pydantic_fields(MANIFEST_PY, "Artifact")
    assert {swift("Artifact", "backendXNNPACK"), swift("Artifact", "backendCoreML")} == set(
        _literal_values(artifact["backend"].annotation)
    )
    assert {swift("Artifact", "formatPTE"), swift("Artifact", "formatMLPackage")} == set(
        _literal_values(artifact["format"].annotation)
    )
    assert (
        swift("ManifestVerifier", "publicKeyBytes") == 32
        and swift("ManifestVerifier", "signatureBytes") == 64
    )
    assert "64-byte Ed25519 signature" in PROTOCOL


@pytest.mark.parametrize(
    "swift_type, python_model",
    [
        ("Manifest", "Manifest"),
        ("FileEntry", "FileEntry"),
        ("TensorSpec", "TensorSpec"),
        ("Normalization", "Normalization"),
        ("Artifact", "Artifact"),
        ("TierEntry", "TierEntry"),
        ("BackendEntry", "BackendEntry"),
        ("SignatureInfo", "SignatureInfo"),
        ("P256SignatureInfo", "P256SignatureInfo"),
        ("SlotPrototypesEntry", "SlotPrototypes"),
    ],
)
def test_manifest_codable_keys_exist_in_the_schema(swift_type, python_model):
    """Every key Swift decodes is a field of export/manifest.py; a non-optional Swift one is never null."""
    path = SOURCES / "Manifest" / "Manifest.swift"
    keys = _coding_keys(path, swift_type)
    optionals = _swift_optionals(path, swift_type)
    fields = _pydantic_fields(MANIFEST_PY, python_model)
    assert set(keys) == set(optionals), f"{swift_type}: CodingKeys and stored properties differ"
    for prop, key in keys.items():
        assert key in fields, (
            f"Swift {swift_type}.{prop} reads {key!r}, which manifest.py {python_model} lacks"
        )
        nullable = "None" in ast.unparse(fields[key].annotation)
        assert optionals[prop] or not nullable, f"{swift_type}.{prop} must be Optional: {key} can be null"


def test_variant_choice_and_updates_follow_the_python_rules():
    """VariantChooser ranks verdicts as manifest.py lists them and names only exported variants; the
    model store's pointer file and the provisioning constants are the Python ones."""
    assert swift("VariantChooser", "verdictOrder") == list(MANIFEST["VERDICTS"])
    device_manifest = _module_constants(ROOT / "harmony_mobile" / "device" / "manifest.py")
    assert swift("VariantChooser", "verdictOrder") == list(device_manifest["VERDICT_ORDER"])
    assert swift("VariantChooser", "pteQuantizations") == list(device_manifest["PTE_PREFERENCE"])
    assert set(swift("VariantChooser", "coreMLQuantizations")) == set(TIERS["COREML_QUANTIZATIONS"])
    assert set(swift("VariantChooser", "pteQuantizations")) == set(TIERS["XNNPACK_QUANTIZATIONS"])
    store = _module_constants(ROOT / "harmony_mobile" / "device" / "model_store.py")
    assert swift("ModelStore", "currentFile") == store["CURRENT_FILE"]
    assert swift("ModelStore", "versionsDirectory") == store["VERSIONS_DIR"]
    provisioning = _module_constants(ROOT / "export" / "provisioning.py")
    for swift_name, python_name in [
        ("uriPrefix", "URI_PREFIX"),
        ("managedConfigKey", "MANAGED_CONFIG_KEY"),
        ("kind", "PAYLOAD_KIND"),
        ("format", "PAYLOAD_FORMAT"),
        ("minSecretBytes", "MIN_SECRET_BYTES"),
        ("maxSecretBytes", "MAX_SECRET_BYTES"),
        ("serverKeyBytes", "SERVER_KEY_BYTES"),
        ("maxOwnClassTiers", "MAX_OWN_CLASS_TIERS"),
        ("maxTierNameCharacters", "MAX_TIER_NAME_CHARS"),
        ("maxOwnClasses", "MAX_OWN_CLASSES"),
        ("maxClassNameCharacters", "MAX_CLASS_NAME_CHARS"),
    ]:
        assert swift("ProvisioningPayload", swift_name) == provisioning[python_name], swift_name
    assert swift("ProvisioningPayload", "placeholderSecret") == provisioning["PLACEHOLDER_SECRET"]
    updates = _swift_text(TESTS / "ModelUpdateTests.swift")
    for case in ("RollbackError", "P256.Signing.PrivateKey()", "tampered: true", "VariantChooser.choose"):
        assert case in updates, case


# --------------------------------------------------------------------------- HTTP


def _endpoints() -> dict[str, tuple[str, str]]:
    return {name: swift("Endpoint", name) for (owner, name) in CONSTANTS if owner == "Endpoint"}


def test_endpoints_exist_in_openapi_and_the_protocol():
    endpoints = _endpoints()
    assert {"enrol", "uploads", "infer", "inferVersion", "manifest", "manifestSignature", "ready"} <= set(
        endpoints
    )
    model = swift("HarmonyHTTPClient", "modelName")
    for name, (method, path) in endpoints.items():
        assert path in OPENAPI["paths"], f"Endpoint.{name} {path} is not a server route"
        assert method.lower() in OPENAPI["paths"][path], f"Endpoint.{name}: the server has no {method} {path}"
        documented = path.replace("{name}", model).replace("{version}", "{v}")
        assert f"{method} {documented}" in PROTOCOL, (
            f"Endpoint.{name}: PROTOCOL.md does not document {method} {path}"
        )
    settings = _module_constants(ROOT / "server" / "core" / "settings.py")
    assert model == settings["MODEL_NAME"]


def test_headers_and_bodies_match_the_server_schemas():
    schemas = OPENAPI["components"]["schemas"]
    infer = OPENAPI["paths"]["/v2/models/{name}/infer"]["post"]
    header_names = {p["name"] for p in infer.get("parameters", []) if p["in"] == "header"}
    assert swift("HarmonyHTTPClient", "tierHeader").lower() in header_names
    assert f"`{swift('HarmonyHTTPClient', 'tierHeader')}: " in PROTOCOL

    client = SOURCES / "Net" / "HarmonyHTTPClient.swift"
    text = client.read_text(encoding="utf-8")
    body = text[text.index("func uploadBody(") : text.index("func upload(body:")]
    assert re.findall(r'JSONText\.string\("(\w+)"\)', body) == ["label_epoch", "message_id", "envelope"]
    assert set(schemas["UploadRequest"]["required"]) == {"label_epoch", "message_id", "envelope"}
    for swift_type, schema in [
        ("Enrollment", "EnrolResponse"),
        ("Limits", "Limits"),
        ("UploadReceipt", "UploadReceiptResponse"),
        ("InferResponse", "InferResponse"),
    ]:
        keys = set(_coding_keys(client, swift_type).values())
        assert keys <= set(schemas[schema]["properties"]), (
            f"{swift_type}: {keys - set(schemas[schema]['properties'])}"
        )
    enrolment = set(_coding_keys(client, "Enrollment").values())
    assert enrolment == set(schemas["EnrolResponse"]["properties"])
    for output in ("slot_scores", "top_slot", "confidence"):
        assert f'output("{output}")' in text and f"{output}" in PROTOCOL
    assert '"Authorization"' in text and '"Bearer "' in text and "Authorization: Bearer <token>" in PROTOCOL


def test_retry_and_upload_status_rules_follow_the_protocol():
    retryable = set(swift("RetryPolicy", "retryableStatuses"))
    # PROTOCOL.md 4.6 / 8: on 429 and 503 wait Retry-After; both carry the header.
    assert {429, 503} <= retryable
    for status in (429, 503):
        assert re.search(rf"^\| {status} \|.*Retry-After", PROTOCOL, re.M), status
    permanent = set(swift("ConfirmedUploads", "permanentStatuses"))
    assert permanent == {400, 409, 413, 422}
    assert not permanent & retryable
    for status in permanent:
        assert re.search(rf"^\| {status} \|", PROTOCOL, re.M), status


# --------------------------------------------------------------------------- tests, fixtures, packages


def test_every_vector_file_the_xctests_read_exists_and_every_kind_is_read():
    referenced = set(re.findall(r'Vectors\.load\("([^"]+)"', _swift_text(*_swift_files(TESTS))))
    vectors = {p.name for p in (ROOT / "tests" / "vectors").glob("*.json")}
    assert referenced, "the XCTests read no golden vectors"
    assert referenced <= vectors, f"XCTests read missing vectors: {sorted(referenced - vectors)}"
    assert referenced == vectors, f"golden vectors no XCTest reads: {sorted(vectors - referenced)}"
    loader = (TESTS / "Vectors.swift").read_text(encoding="utf-8")
    # The loader climbs from Tests/HarmonyKitTests/Vectors.swift to the repository root.
    climbs = loader.count(".deletingLastPathComponent() //")
    assert (TESTS / "Vectors.swift").parents[climbs - 1] == ROOT
    assert '"tests/vectors"' in loader


def test_tree_digest_fixture_is_what_the_python_exporter_computes():
    from harmony_mobile.export.manifest import path_digest

    expected = json.loads((TESTS / "Fixtures" / "tree_digest.json").read_text(encoding="utf-8"))
    sha, size = path_digest(TESTS / "Fixtures" / "tree")
    assert (sha, size) == (expected["sha256"], expected["size"])


def test_bundled_samples_are_the_android_ones_and_no_app_bundles_a_secret():
    android = ROOT / "android_demo" / "app" / "src" / "main" / "assets"
    resources = APP / "HarmonyDemo" / "Resources"
    assert (resources / "digits.json").read_bytes() == (android / "samples" / "digits.json").read_bytes()
    for folder in (android, resources):  # the secret is provisioned at run time (docs/PROVISIONING.md)
        assert not [p for p in folder.rglob("provisioning*") if p.is_file()], folder


def test_packages_keep_executorch_out_of_the_core_and_pin_the_exporter_version():
    core = (KIT / "Package.swift").read_text(encoding="utf-8")
    assert "// swift-tools-version:5.9" in core
    assert ".iOS(.v16)" in core and ".macOS(.v13)" in core
    assert ".package(" not in core, "HarmonyKit must build and test without dependencies"
    for path in _swift_files(SOURCES, TESTS):
        assert "import ExecuTorch" not in path.read_text(encoding="utf-8"), path
    executorch = (ET_PACKAGE / "Package.swift").read_text(encoding="utf-8")
    branch = re.search(r'let executorchBranch = "(swiftpm-[0-9.]+)"', executorch).group(1)
    pinned = re.search(
        r'"executorch==([0-9.]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    ).group(1)
    assert branch == f"swiftpm-{pinned}", "the iOS runtime must be the release that exports the .pte files"
    gradle = (ROOT / "android_demo" / "app" / "build.gradle.kts").read_text(encoding="utf-8")
    assert f'executorchVersion = "{pinned}"' in gradle
    assert ".iOS(.v17)" in executorch  # the ExecuTorch package's own minimum
    for product in ("executorch", "backend_xnnpack", "kernels_optimized"):
        assert f'.product(name: "{product}", package: "executorch")' in executorch
    assert f"`{branch}`" in (IOS / "README.md").read_text(encoding="utf-8")


def _pbx_strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def test_xcode_project_is_well_formed_and_points_at_real_files():
    raw = PBXPROJ.read_text(encoding="utf-8")
    assert raw.startswith("// !$*UTF8*$!")
    text = _pbx_strip(raw)
    for opening, closing in ("{}", "()"):
        depth = 0
        for char in text:
            depth += {opening: 1, closing: -1}.get(char, 0)
            assert depth >= 0
        assert depth == 0, f"unbalanced {opening}{closing}"
    defined = re.findall(r"^\t\t([0-9A-F]{24}) (?:/\*[^*]*\*/ )?= \{", raw, re.M)
    assert len(defined) == len(set(defined)), "an object id is defined twice"
    used = set(re.findall(r"\b([0-9A-F]{24})\b", raw))
    assert used == set(defined), f"undefined or unused ids: {sorted(used ^ set(defined))}"
    isa = dict(re.findall(r"^\t\t([0-9A-F]{24}) (?:/\*[^*]*\*/ )?= \{\s*isa = (\w+);", raw, re.M))
    root = re.search(r"rootObject = ([0-9A-F]{24})", raw).group(1)
    assert isa[root] == "PBXProject"
    for path in re.findall(r"relativePath = ([^;]+);", raw):
        assert (APP / path / "Package.swift").is_file(), path
    for path in re.findall(r"isa = PBXFileSystemSynchronizedRootGroup;\s*path = (\w+);", raw):
        assert (APP / path).is_dir(), path
    sources = {p.name for p in (APP / "HarmonyDemo").glob("*.swift")}
    assert {"HarmonyDemoApp.swift", "ContentView.swift", "DemoModel.swift"} <= sources
    assert (APP / "Export" / "README.md").is_file()
    info = re.search(r"(?<![A-Z_])INFOPLIST_FILE = ([^;]+);", raw).group(1)
    plist = plistlib.loads((APP / info).read_bytes())
    assert plist["NSCameraUsageDescription"]
    targets = {float(v) for v in re.findall(r"IPHONEOS_DEPLOYMENT_TARGET = ([0-9.]+);", raw)}
    assert targets == {17.0}, "ExecuTorch's Swift package requires iOS 17"
    assert '"-all_load"' in raw, "ExecuTorch kernels and backends register from static initializers"
    products = set(re.findall(r"isa = XCSwiftPackageProductDependency;[^}]*productName = (\w+);", raw))
    assert products == {"HarmonyKit", "HarmonyKitExecuTorch"}
    # An iPad app that supports multitasking must support every orientation (else Xcode warns and
    # App Store validation asks for UIRequiresFullScreen); the iPhone layout stays portrait.
    ipad = re.findall(r'INFOPLIST_KEY_UISupportedInterfaceOrientations_iPad = "([^"]+)";', raw)
    assert ipad and all(
        set(value.split())
        == {
            "UIInterfaceOrientationPortrait",
            "UIInterfaceOrientationPortraitUpsideDown",
            "UIInterfaceOrientationLandscapeLeft",
            "UIInterfaceOrientationLandscapeRight",
        }
        for value in ipad
    )
    assert "INFOPLIST_KEY_UISupportedInterfaceOrientations =" not in raw


# --------------------------------------------------------------------------- per-file Swift imports


def _swift_imports_module():
    spec = importlib.util.spec_from_file_location(
        "swift_imports", ROOT / "ios_demo" / "tools" / "swift_imports.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("swift_imports", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_swift_file_imports_the_modules_whose_symbols_it_uses():
    checker = _swift_imports_module()
    assert checker.problems() == []


def test_the_import_check_catches_a_missing_or_non_testable_import():
    checker = _swift_imports_module()
    sources = {name: checker.module_files(directory) for name, (directory, _) in checker.MODULES.items()}
    tests = sources["HarmonyKitTests"]
    vectors = next(path for path in tests if path.name == "Vectors.swift")
    tests[vectors] = tests[vectors].replace("@testable import HarmonyKit\n", "")
    assert [
        p for p in checker.problems(sources) if "Vectors.swift" in p and "does not import HarmonyKit" in p
    ]

    probe = vectors.with_name("Probe.swift")
    tests[probe] = (
        'import HarmonyKit\nimport XCTest\n// Hex in a comment\nlet s = "\\(ModelMetadataResponse.self)"\n'
    )
    assert any("internal ModelMetadataResponse" in p and "@testable" in p for p in checker.problems(sources))
    tests[probe] = 'import XCTest\n// uses Hex only in a comment, and "Hex" in a string\nlet s = "Hex"\n'
    assert not [p for p in checker.problems(sources) if "Probe.swift" in p]
    tests[probe] = "import HarmonyKit\nfinal class Probe: XCTestCase {}\n"
    assert any("Probe.swift" in p and "does not import XCTest" in p for p in checker.problems(sources))
