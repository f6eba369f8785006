"""The demo apps' provisioning, update and lifecycle wiring, read from their sources (no Android SDK
or Swift toolchain here): what harmony-core / HarmonyKit implement and test must be what the apps
call, and the things the apps must not do any more (bundle a secret, fall back to a placeholder,
reload the model on rotation, leak a late session, open a second upload queue) stay gone."""

from __future__ import annotations

import plistlib
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from urllib.parse import urlsplit

from harmony_mobile.export.provisioning import MANAGED_CONFIG_KEY, URI_PREFIX

ROOT = Path(__file__).resolve().parents[1]
ANDROID = ROOT / "android_demo" / "app"
KOTLIN = ANDROID / "src" / "main" / "java" / "org" / "harmonymobile" / "demo"
IOS_APP = ROOT / "ios_demo" / "HarmonyDemo"
SWIFT = IOS_APP / "HarmonyDemo"
ANDROID_NS = "{http://schemas.android.com/apk/res/android}"


def _text(*paths: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def _code(path: Path) -> str:
    """Source without // comments, so a sentence about an old behaviour does not count as using it."""
    return re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8"))


def test_no_app_reads_a_bundled_secret_or_falls_back_to_a_placeholder():
    sources = sorted(KOTLIN.glob("*.kt")) + sorted(SWIFT.glob("*.swift"))
    for path in sources:
        code = _code(path)
        assert "provisioning.json" not in code and "provisioning.local" not in code, path.name
        assert "federation_secret_hex" not in code, path.name
    session = _code(KOTLIN / "DemoSession.kt")
    assert (
        "context.assets" not in session
        and "SecretCheck.requireMatches(federation, model.manifest)" in session
    )
    assert "private val federation: FederationKey," in session  # given, never built from a file
    model = _code(SWIFT / "DemoModel.swift")
    assert (
        "SecretCheck.requireMatches(federationKey" in model and "ProvisioningStore.federationKey()" in model
    )


def test_the_provisioning_link_and_managed_config_reach_both_apps():
    scheme, host = urlsplit(URI_PREFIX).scheme, urlsplit(URI_PREFIX).netloc
    manifest = ElementTree.parse(ANDROID / "src" / "main" / "AndroidManifest.xml").getroot()
    data = [d.attrib for d in manifest.iter("data")]
    assert {f"{ANDROID_NS}scheme": scheme, f"{ANDROID_NS}host": host} in data
    restrictions = ElementTree.parse(
        ANDROID / "src" / "main" / "res" / "xml" / "app_restrictions.xml"
    ).getroot()
    assert [r.attrib[f"{ANDROID_NS}key"] for r in restrictions] == [MANAGED_CONFIG_KEY]
    activity = _code(KOTLIN / "MainActivity.kt")
    assert (
        "ProvisioningPayload.URI_PREFIX" in activity and "ProvisioningPayload.MANAGED_CONFIG_KEY" in activity
    )
    assert "onNewIntent" in activity
    store = _code(KOTLIN / "CredentialStore.kt")
    assert "fun applyProvisioning(payload: ProvisioningPayload)" in store and "AndroidKeyStore" in store
    plist = plistlib.loads((IOS_APP / "Info.plist").read_bytes())
    assert scheme in [s for t in plist["CFBundleURLTypes"] for s in t["CFBundleURLSchemes"]]
    assert ".onOpenURL" in _code(SWIFT / "HarmonyDemoApp.swift")
    ios_store = _code(SWIFT / "ModelStore.swift")
    assert (
        "com.apple.configuration.managed" in ios_store and "ProvisioningPayload.managedConfigKey" in ios_store
    )
    # the secret sits in the app's one Keychain item type, never leaving the device
    assert 'KeychainItem(account: "federation-secret")' in ios_store
    keychain = _code(SWIFT / "CredentialStore.swift")
    assert (
        "struct KeychainItem" in keychain and "kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly" in keychain
    )


def test_android_keeps_the_model_in_a_view_model_and_closes_every_session():
    activity = _code(KOTLIN / "MainActivity.kt")
    assert "by viewModels()" in activity
    assert "DemoSession(" not in activity and "ModelInstaller(" not in activity, (
        "loading belongs to the ViewModel"
    )
    view_model = _code(KOTLIN / "DemoViewModel.kt")
    assert "override fun onCleared()" in view_model and "session?.close()" in view_model
    # a session built after the scope was cancelled is closed in `finally`, not dropped
    assert re.search(r"finally \{\s*created\?\.close\(\)", view_model)
    gradle = (ANDROID / "build.gradle.kts").read_text(encoding="utf-8")
    assert "androidx.lifecycle:lifecycle-viewmodel-ktx" in gradle


def test_ios_opens_one_upload_queue_for_the_apps_lifetime():
    model = _code(SWIFT / "DemoModel.swift")
    assert model.count("UploadQueue(") == 1 and "uploadQueue ?? UploadQueue(" in model


def test_both_apps_install_through_the_model_store_and_prefer_a_passing_variant():
    installer = _code(KOTLIN / "ModelInstaller.kt")
    for use in ("ModelStore(", "VariantChooser.PTE_PREFERENCE", "RollbackException", "signedManifest("):
        assert use in installer, use
    assert "PREFERRED_QUANTIZATIONS" not in installer
    ios = _code(SWIFT / "ModelStore.swift")
    for use in ("ModelStore(root:", "VariantChooser.choose(", "catch is RollbackError", ".manifest(device:"):
        assert use in ios, use


def test_sample_digits_are_fitted_to_the_tier_in_both_apps():
    assert "PixelImages.fit(" in _code(KOTLIN / "DigitImages.kt")
    assert "sample.image.fitTo(" in _code(KOTLIN / "MainActivity.kt")
    assert "PixelImages.fit(" in _code(SWIFT / "DigitImage.swift")
    assert "picture.fitted(to: tier)" in _code(SWIFT / "DemoModel.swift")


def test_every_runtime_downloads_artifacts_from_the_servers_artifacts_route():
    """The default artifact base is the server's GET /v1/artifacts (docs/PROTOCOL.md 2.4) in the Python
    device runtime, harmony-core, HarmonyKit and both demos; no app still points at `<server>/export`."""
    from harmony_mobile.device import ARTIFACTS_PATH

    core = ROOT / "android_demo" / "harmony-core" / "src" / "main" / "java" / "org" / "harmonymobile" / "core"
    java = _code(core / "server" / "HarmonyServerClient.java")
    kit = _code(
        ROOT / "ios_demo" / "HarmonyKit" / "Sources" / "HarmonyKit" / "Net" / "HarmonyHTTPClient.swift"
    )
    assert ARTIFACTS_PATH == "/v1/artifacts"
    assert f'ARTIFACTS_PATH = "{ARTIFACTS_PATH}"' in java
    assert f'artifactBasePath = "{ARTIFACTS_PATH.lstrip("/")}"' in kit
    assert f'path: "{ARTIFACTS_PATH}/{{path}}"' in kit
    assert "client.artifacts(credentials)" in _code(KOTLIN / "ModelInstaller.kt")
    assert "HarmonyHTTPClient.artifactBasePath" in _code(SWIFT / "DemoModel.swift")
    assert '"Bearer " + token' in _code(SWIFT / "ModelStore.swift")
    for path in sorted(KOTLIN.glob("*.kt")) + sorted(SWIFT.glob("*.swift")) + [ANDROID / "build.gradle.kts"]:
        code = _code(path)
        assert '/export"' not in code and 'appendingPathComponent("export")' not in code, path.name
