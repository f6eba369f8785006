package org.harmonymobile.demo

import android.content.Context
import java.io.File
import java.time.Duration
import org.harmonymobile.core.Classification
import org.harmonymobile.core.ConfirmedUploads
import org.harmonymobile.core.ExitDecoder
import org.harmonymobile.core.FallbackServer
import org.harmonymobile.core.FederationKey
import org.harmonymobile.core.HarmonyClient
import org.harmonymobile.core.SlotDecoder
import org.harmonymobile.core.engine.SerializedEngine
import org.harmonymobile.core.net.RetryPolicy
import org.harmonymobile.core.net.RetryingTransport
import org.harmonymobile.core.net.UrlConnectionTransport
import org.harmonymobile.core.provisioning.SecretCheck
import org.harmonymobile.core.queue.UploadQueue
import org.harmonymobile.core.server.DeviceCredentials
import org.harmonymobile.core.server.Enrollment
import org.harmonymobile.core.server.HarmonyServerClient
import org.harmonymobile.core.wire.FeatureTensor

/**
 * Everything the screen uses, wired once a model is installed: the engine, the early-exit client (whose
 * exit head, in token order, is named with the federation secret) and, when the device is enrolled,
 * the fallback server (whose slots are decoded with the federation secret) and the confirmed-label
 * upload queue. All methods block; call them off the main thread.
 * [close] may come from the main thread while an inference runs: the engine is a [SerializedEngine],
 * so the close waits for it instead of destroying a module mid-forward.
 *
 * The federation secret is the provisioned one ([CredentialStore.federationKey]); there is no fallback:
 * a secret that is not this model's (its class tokens are not the manifest's slot table) stops the
 * session before anything is tokenized or decoded.
 */
class DemoSession(
    context: Context,
    val model: ModelInstaller.InstalledModel,
    private val serverUrl: String,
    credentials: DeviceCredentials?,
    private val federation: FederationKey,
    ownClasses: Map<String, List<String>>,
) : AutoCloseable {

    init {
        SecretCheck.requireMatches(federation, model.manifest)
    }

    /** The exit head's outputs are in token order under the manifest's label epoch (before the engine loads). */
    private val exits = ExitDecoder(
        federation,
        requireNotNull(model.manifest.labelEpoch()) {
            "this export names no label epoch, so its exit head cannot be decoded: re-export it"
        },
        model.manifest.classNames(),
    )

    /**
     * Max softmax, or the slot gate by the classes the provisioning payload says this tier's phone
     * holds (its front-end was personalized on them). A slot-gated tier without them stops the session
     * before the engine loads: its threshold is never misread as a max-softmax one.
     */
    private val gate = model.installed.exitGate(federation, ownClasses[model.tier.name()])
    private val engine = SerializedEngine(ExecuTorchEngine(model.file.absolutePath, model.tier))
    private val server = HarmonyServerClient(
        RetryingTransport(
            UrlConnectionTransport(serverUrl, Duration.ofSeconds(3), Duration.ofSeconds(10)),
            // Inference is interactive: one quick retry, then the local answer stands.
            RetryPolicy(2, Duration.ofMillis(200), 2.0, Duration.ofMillis(400), Duration.ofSeconds(2), java.util.Random()),
        ),
    )
    private val uploadServer = HarmonyServerClient(
        RetryingTransport(UrlConnectionTransport(serverUrl, Duration.ofSeconds(5), Duration.ofSeconds(30)), RetryPolicy.defaults()),
    )
    private val fallback: FallbackServer? = credentials?.let { device ->
        FallbackServer { features: FeatureTensor -> server.infer(device, features, model.tier.name(), null)[0] }
    }

    /** Seeded with the manifest's own slot table; answers from another back-end version fetch theirs. */
    private val slots: SlotDecoder? = credentials?.let { device ->
        SlotDecoder(federation, model.manifest.classNames()) { version -> server.slotTable(device, version) }.apply {
            remember(model.manifest.backendModelVersion(), model.manifest.slotTable())
        }
    }
    val client = HarmonyClient(engine, gate, exits, fallback, slots)

    /** Uploads name the lineage's label epoch, which the verified manifest carries. */
    val uploads: ConfirmedUploads? = credentials?.takeIf { model.manifest.labelEpoch() != null }?.let { device ->
        ConfirmedUploads(
            UploadQueue(File(context.filesDir, "upload-queue").toPath(), MAX_QUEUED, MAX_QUEUE_BYTES, UploadQueue.OverflowPolicy.REJECT_NEW),
            uploadServer,
            device,
            federation,
            model.manifest.labelEpoch(),
            model.manifest.classNames(),
            model.tier.family(),
            model.tier.name(),
            model.tier.splitDepth(),
            model.manifest.modelVersion(),
        )
    }
    val enrolled: Boolean = credentials != null

    fun classify(input: FloatArray): Classification = client.classify(input)

    override fun close() = engine.close()

    companion object {
        const val MAX_QUEUED = 512

        /** POST /v1/devices with the admin token (demo convenience; fleets enrol from a provisioning service). */
        fun enroll(serverUrl: String, adminToken: String, deviceName: String, tier: String): Enrollment =
            HarmonyServerClient(
                RetryingTransport(UrlConnectionTransport(serverUrl, Duration.ofSeconds(5), Duration.ofSeconds(30)), RetryPolicy.defaults()),
            ).enroll(adminToken, deviceName, tier)

        const val MAX_QUEUE_BYTES = 32L * 1024 * 1024
    }
}
