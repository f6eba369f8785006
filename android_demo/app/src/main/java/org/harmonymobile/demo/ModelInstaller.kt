package org.harmonymobile.demo

import android.content.Context
import java.io.File
import java.net.URI
import java.time.Duration
import org.harmonymobile.core.manifest.Artifact
import org.harmonymobile.core.manifest.Manifest
import org.harmonymobile.core.manifest.ManifestException
import org.harmonymobile.core.manifest.ManifestVerifier
import org.harmonymobile.core.manifest.SignedManifest
import org.harmonymobile.core.manifest.TierEntry
import org.harmonymobile.core.manifest.VariantChooser
import org.harmonymobile.core.net.RetryPolicy
import org.harmonymobile.core.net.RetryingTransport
import org.harmonymobile.core.net.UrlConnectionTransport
import org.harmonymobile.core.server.DeviceCredentials
import org.harmonymobile.core.server.HarmonyServerClient
import org.harmonymobile.core.tier.DeviceCapabilities
import org.harmonymobile.core.tier.DeviceClass
import org.harmonymobile.core.tier.TierSelector
import org.harmonymobile.core.update.ArtifactSource
import org.harmonymobile.core.update.ModelStore
import org.harmonymobile.core.update.RollbackException

/**
 * The model this phone runs, kept in a harmony-core [ModelStore] under filesDir/model-store: the export
 * bundled under `assets/export/` on first start, then newer signed exports from the server. Every
 * install verifies the manifest's ECDSA P-256 signature (manifest.p256.sig) with the pinned P-256 key,
 * refuses a manifest older than the installed one (a rollback), picks the tier for this device and a
 * variant that passed the export's checks ([VariantChooser]), checks the artifact's sha256 and size,
 * and only then switches, atomically. A bundled export older than an installed update is refused the
 * same way, so an app update cannot take the phone back either.
 */
class ModelInstaller(private val context: Context, pinnedKeyBase64: String) {

    data class InstalledModel(
        val manifest: Manifest,
        val tier: TierEntry,
        val artifact: Artifact,
        val file: File,
        val deviceClass: DeviceClass,
        /** What the store verified, including a slot-gated tier's prototypes ([ModelStore.Installed.exitGate]). */
        val installed: ModelStore.Installed,
    )

    private val verifier: ManifestVerifier = run {
        if (pinnedKeyBase64.trim().isEmpty()) {
            throw ManifestException(
                "no pinned manifest key: run `harmony export-app android --pinned-key ...` or set harmony.pinnedManifestKey")
        }
        // P-256: `SHA256withECDSA` is in the JCA of every Android release; Ed25519 is missing on many 13-15 phones
        ManifestVerifier.forP256PublicKeyFile(pinnedKeyBase64)
    }
    private val store = ModelStore(
        File(context.filesDir, "model-store").toPath(), verifier, "xnnpack", VariantChooser.PTE_PREFERENCE)

    /** Installs the bundled export unless a newer one is installed, then returns the installed model. */
    fun install(device: DeviceCapabilities): InstalledModel {
        val bundled = SignedManifest(readAsset(ManifestVerifier.MANIFEST_FILE), readAsset(verifier.signatureFile()))
        try {
            store.install(bundled, ArtifactSource { path -> context.assets.open("$EXPORT_DIR/$path") }) { tierFor(it, device) }
        } catch (older: RollbackException) {
            // The installed model is newer than the one in the APK: keep it.
        }
        return current(device)
    }

    /**
     * Fetches the server's manifest; when it is newer, downloads its artifact from the server
     * (`GET /v1/artifacts/<path>` with the device token, docs/PROTOCOL.md 2.4) or, when
     * [artifactBaseUrl] is set, from there (where the export directory is published), and switches
     * to it. Returns the installed model and whether it changed. A rollback or a bad signature or
     * artifact throws and changes nothing.
     */
    fun update(device: DeviceCapabilities, serverUrl: String, credentials: DeviceCredentials, artifactBaseUrl: String): Pair<InstalledModel, Boolean> {
        val client = HarmonyServerClient(
            RetryingTransport(UrlConnectionTransport(serverUrl, Duration.ofSeconds(5), Duration.ofSeconds(30)), RetryPolicy.defaults()))
        val signed = client.signedManifest(credentials, verifier.signatureFile())
        val source = if (artifactBaseUrl.isEmpty()) {
            client.artifacts(credentials)
        } else {
            val base = URI(artifactBaseUrl.trimEnd('/') + "/")
            ArtifactSource { path -> base.resolve(path).toURL().openStream() }
        }
        val changed = store.install(signed, source) { tierFor(it, device) }
        return current(device) to changed.isPresent
    }

    private fun current(device: DeviceCapabilities): InstalledModel {
        val installed = store.current { tierFor(it, device) }
            .orElseThrow { ManifestException("no model installed") }
        return InstalledModel(
            installed.manifest(), installed.tier(), installed.artifact(), installed.file().toFile(), DeviceClass.of(device), installed)
    }

    private fun tierFor(manifest: Manifest, device: DeviceCapabilities): TierEntry = TierSelector.select(manifest.tiers(), device)

    private fun readAsset(name: String): ByteArray =
        context.assets.open("$EXPORT_DIR/$name").use { it.readBytes() }

    private companion object {
        const val EXPORT_DIR = "export"
    }
}
