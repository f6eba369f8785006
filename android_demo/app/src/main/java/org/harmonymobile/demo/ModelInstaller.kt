package org.harmonymobile.demo

import android.content.Context
import java.io.File
import org.harmonymobile.core.manifest.Artifact
import org.harmonymobile.core.manifest.Manifest
import org.harmonymobile.core.manifest.ManifestException
import org.harmonymobile.core.manifest.ManifestVerifier
import org.harmonymobile.core.manifest.TierEntry
import org.harmonymobile.core.tier.DeviceCapabilities
import org.harmonymobile.core.tier.DeviceClass
import org.harmonymobile.core.tier.TierSelector

/**
 * Installs the model this phone runs from the export bundled under `assets/export/`:
 * verify the manifest's ECDSA P-256 signature (manifest.p256.sig) with the pinned P-256 key, pick the
 * tier for this device, copy its `.pte`
 * out of the APK into internal storage (ExecuTorch loads from a file path, not from an asset), and
 * check the copy's sha256 and size against the manifest before anything loads it.
 */
class ModelInstaller(private val context: Context) {

    data class InstalledModel(
        val manifest: Manifest,
        val tier: TierEntry,
        val artifact: Artifact,
        val file: File,
        val deviceClass: DeviceClass,
    )

    /**
     * @param pinnedKeyBase64 the export's signing_key_p256.pub: P-256, because `SHA256withECDSA` is in the
     *   JCA of every Android release while Ed25519 is missing on many Android 13-15 phones
     */
    fun install(device: DeviceCapabilities, pinnedKeyBase64: String): InstalledModel {
        if (pinnedKeyBase64.isBlank()) {
            throw ManifestException(
                "no pinned manifest key: run `harmony export-app android` or set harmony.pinnedManifestKey in gradle.properties")
        }
        val manifest = ManifestVerifier.forP256PublicKeyFile(pinnedKeyBase64)
            .verify(readAsset(MANIFEST), readAsset(SIGNATURE))
        val tier = TierSelector.select(manifest.tiers(), device)
        val artifact = PREFERRED_QUANTIZATIONS.firstNotNullOfOrNull { tier.artifact("xnnpack", it).orElse(null) }
            ?: throw ManifestException("tier ${tier.name()} has no XNNPACK .pte")
        val file = copyVerified(artifact)
        return InstalledModel(manifest, tier, artifact, file, DeviceClass.of(device))
    }

    /** Content-addressed copy in filesDir/models; re-verified on every start, since files can be damaged. */
    private fun copyVerified(artifact: Artifact): File {
        val directory = File(context.filesDir, "models").apply { mkdirs() }
        val target = File(directory, "${artifact.sha256()}.pte")
        if (!target.isFile) {
            val temp = File(directory, "${artifact.sha256()}.part")
            context.assets.open("$EXPORT_DIR/${artifact.path()}").use { input ->
                temp.outputStream().use { output ->
                    input.copyTo(output)
                    output.fd.sync()
                }
            }
            ManifestVerifier.verifyFile(artifact, temp.toPath())
            if (!temp.renameTo(target)) {
                throw ManifestException("could not move the verified model into place: $target")
            }
        }
        ManifestVerifier.verifyFile(artifact, target.toPath())
        directory.listFiles()?.filter { it != target }?.forEach { it.delete() } // models of older exports
        return target
    }

    private fun readAsset(name: String): ByteArray =
        context.assets.open("$EXPORT_DIR/$name").use { it.readBytes() }

    private companion object {
        const val EXPORT_DIR = "export"
        const val MANIFEST = ManifestVerifier.MANIFEST_FILE
        const val SIGNATURE = ManifestVerifier.P256_SIGNATURE_FILE

        /** int8 first: smaller and faster on phones; fp32 when a tier was exported without int8. */
        val PREFERRED_QUANTIZATIONS = listOf("int8", "fp32")
    }
}
