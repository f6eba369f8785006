package org.harmonymobile.demo

import android.graphics.Bitmap
import android.os.Build
import android.os.Bundle
import android.widget.ArrayAdapter
import androidx.activity.result.contract.ActivityResultContracts
import androidx.appcompat.app.AppCompatActivity
import androidx.lifecycle.lifecycleScope
import java.util.Locale
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.harmonymobile.core.Classification
import org.harmonymobile.core.manifest.ManifestVerifier
import org.harmonymobile.core.queue.QueueFullException
import org.harmonymobile.demo.databinding.ActivityMainBinding

/**
 * The demo screen: the phone's tier, bundled sample digits and camera pictures classified on the phone
 * (early exit) or by the fallback server, local vs server answers with latency, and uploads of
 * user-confirmed labels through the sealed, durable queue.
 */
class MainActivity : AppCompatActivity() {
    private lateinit var binding: ActivityMainBinding
    private lateinit var credentials: CredentialStore
    private var session: DemoSession? = null
    private var samples: List<SampleDigit> = emptyList()
    private var nextSample = 0
    private var lastResult: Classification? = null

    private val takePicture = registerForActivityResult(ActivityResultContracts.TakePicturePreview()) { bitmap: Bitmap? ->
        val current = session ?: return@registerForActivityResult
        if (bitmap != null) {
            val shape = current.model.tier.input().shape()
            classify(PixelImage.fromCamera(bitmap, shape[1].toInt(), shape[2].toInt(), shape[3].toInt()), trueLabel = null)
        }
    }

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        binding = ActivityMainBinding.inflate(layoutInflater)
        setContentView(binding.root)
        credentials = CredentialStore(this)
        binding.serverUrlEdit.setText(credentials.serverUrl ?: BuildConfig.DEFAULT_SERVER_URL)

        binding.nextSampleButton.setOnClickListener { classifyNextSample() }
        binding.cameraButton.setOnClickListener { takePicture.launch(null) }
        binding.confirmButton.setOnClickListener { confirmLabel() }
        binding.flushButton.setOnClickListener { flushUploads() }
        binding.enrollButton.setOnClickListener { enroll() }
        setButtonsEnabled(false)
        startSession()
    }

    override fun onDestroy() {
        // A classification may still be running on Dispatchers.Default: the session's engine is a
        // SerializedEngine, so this waits for it (one forward pass) instead of destroying the module under it.
        session?.close()
        session = null
        super.onDestroy()
    }

    /** Verify and install the model, then wire the session (enrolled or local-only). */
    private fun startSession() {
        val url = binding.serverUrlEdit.text.toString().trim()
        lifecycleScope.launch {
            val result = withContext(Dispatchers.IO) {
                runCatching {
                    val digits = SampleDigits.load(this@MainActivity)
                    val device = DeviceProfiler.capabilities(this@MainActivity)
                    val model = ModelInstaller(this@MainActivity).install(device, BuildConfig.PINNED_MANIFEST_KEY)
                    digits to DemoSession(this@MainActivity, model, url, credentials.load())
                }
            }
            result.onSuccess { (digits, started) ->
                session?.close()
                samples = digits
                session = started
                showTier(started)
                setButtonsEnabled(true)
                refreshQueue()
            }.onFailure { error ->
                binding.tierText.text = getString(R.string.no_model)
                binding.statusText.text = "Model not loaded: ${error.message}"
            }
        }
    }

    private fun showTier(current: DemoSession) {
        val tier = current.model.tier
        binding.tierText.text = String.format(
            Locale.ROOT,
            "Tier %s (%s, split depth %d, %s) for a %s phone, exit threshold %.3f, model %s",
            tier.name(), tier.family(), tier.splitDepth(), current.model.artifact.quantization(),
            current.model.deviceClass.name.lowercase(Locale.ROOT), tier.threshold(), current.model.manifest.modelVersion(),
        )
        binding.labelSpinner.adapter =
            ArrayAdapter(this, android.R.layout.simple_spinner_dropdown_item, tier.classNames())
        binding.statusText.text = if (current.enrolled) {
            "Enrolled: uncertain samples go to ${binding.serverUrlEdit.text}"
        } else {
            "Not enrolled: local answers only (enrol below to enable the fallback server and uploads)"
        }
    }

    private fun classifyNextSample() {
        if (samples.isEmpty()) return
        val sample = samples[nextSample++ % samples.size]
        val channels = session?.model?.tier?.input()?.shape()?.get(1)?.toInt() ?: 1
        classify(SampleDigits.asChannels(sample.image, channels), trueLabel = sample.label)
    }

    private fun classify(image: PixelImage, trueLabel: Int?) {
        val current = session ?: return
        binding.imageView.setImageBitmap(image.toBitmap())
        lifecycleScope.launch {
            val outcome = withContext(Dispatchers.Default) {
                runCatching { current.classify(image.toModelInput(current.model.tier)) }
            }
            outcome.onSuccess { result ->
                lastResult = result
                binding.resultText.text = describe(result, current.model.tier.classNames(), trueLabel)
                if (trueLabel != null) binding.labelSpinner.setSelection(trueLabel)
                else if (result.predictedClass() >= 0) binding.labelSpinner.setSelection(result.predictedClass())
            }.onFailure { binding.resultText.text = "Inference failed: ${it.message}" }
        }
    }

    private fun describe(result: Classification, classNames: List<String>, trueLabel: Int?): String {
        fun name(index: Int) = classNames.getOrNull(index) ?: "?"
        val local = result.local()
        val lines = mutableListOf(
            // the exit head's top output is in token order: Classification.localClass names its class
            String.format(Locale.ROOT, "local : %s  p=%.3f  %.1f ms  (%s)", name(result.localClass()), local.confidence(),
                result.localLatencyNanos() / 1e6, if (local.exitLocally()) "exit" else "below threshold"),
        )
        result.server()?.let { server ->
            lines += String.format(Locale.ROOT, "server: slot %d  p=%.3f  %.1f ms  (back-end %s)", server.topSlot(),
                server.confidence(), result.serverLatencyNanos() / 1e6, server.modelVersion())
        }
        result.serverError()?.let { lines += "server: not used: $it" }
        lines += "answer: ${name(result.predictedClass())} from ${result.source().name.lowercase(Locale.ROOT).replace('_', ' ')}"
        trueLabel?.let { lines += "true label: ${name(it)}" }
        return lines.joinToString("\n")
    }

    /** The user confirmed the label of the last image: seal its features with the label token and queue them. */
    private fun confirmLabel() {
        val current = session ?: return
        val result = lastResult ?: return
        val uploads = current.uploads ?: run {
            binding.statusText.text = if (current.enrolled) {
                "This export names no label epoch (re-export it): uploads cannot be tokened"
            } else {
                "Enrol first: uploads need the server's sealing key"
            }
            return
        }
        val label = binding.labelSpinner.selectedItemPosition
        lifecycleScope.launch {
            val message = withContext(Dispatchers.IO) {
                try {
                    uploads.enqueue(result.features(), label)
                    "Queued a sealed upload for label ${label}; sent ${uploads.flush()}"
                } catch (full: QueueFullException) {
                    "Upload queue full: ${full.message}"
                } catch (e: Exception) {
                    "Queued; sending failed for now (${e.message})"
                }
            }
            binding.statusText.text = message
            refreshQueue()
        }
    }

    private fun flushUploads() {
        val uploads = session?.uploads ?: return
        lifecycleScope.launch {
            val sent = withContext(Dispatchers.IO) { runCatching { uploads.flush() } }
            binding.statusText.text = sent.fold({ "Sent $it queued upload(s)" }, { "Sending failed: ${it.message}" })
            refreshQueue()
        }
    }

    private fun refreshQueue() {
        val uploads = session?.uploads
        lifecycleScope.launch {
            val pending = withContext(Dispatchers.IO) { uploads?.pending() }
            binding.queueText.text = if (pending == null) "Uploads: not enrolled" else "Uploads waiting: $pending"
        }
    }

    /**
     * Demo convenience: enrolment needs the admin token, which a real fleet keeps in its provisioning
     * service, not on phones. The result (device id, token in the Keystore, server key) is kept.
     */
    private fun enroll() {
        val current = session ?: return
        val url = binding.serverUrlEdit.text.toString().trim()
        val adminToken = binding.adminTokenEdit.text.toString().trim()
        lifecycleScope.launch {
            val outcome = withContext(Dispatchers.IO) {
                runCatching {
                    credentials.serverUrl = url
                    val enrollment = DemoSession.enroll(url, adminToken, "${Build.MANUFACTURER} ${Build.MODEL}", current.model.tier.name())
                    // The server's manifest must verify under the same pinned key as the bundled one.
                    enrollment.manifestBytes()?.let { bytes ->
                        val signature = enrollment.manifestP256SignatureFile()
                            ?: throw IllegalStateException("the server's manifest has no P-256 signature (manifest.p256.sig)")
                        ManifestVerifier.forP256PublicKeyFile(BuildConfig.PINNED_MANIFEST_KEY).verify(bytes, signature)
                    }
                    credentials.save(enrollment.credentials())
                    if (enrollment.defaultVersion() == null) {
                        "${enrollment.deviceId()} (the server has no back-end yet: answers stay on the phone)"
                    } else {
                        enrollment.deviceId()
                    }
                }
            }
            binding.adminTokenEdit.text.clear()
            outcome.onSuccess { deviceId ->
                binding.statusText.text = "Enrolled as $deviceId"
                startSession()
            }.onFailure { binding.statusText.text = "Enrolment failed: ${it.message}" }
        }
    }

    private fun setButtonsEnabled(enabled: Boolean) {
        listOf(binding.nextSampleButton, binding.cameraButton, binding.confirmButton, binding.flushButton, binding.enrollButton)
            .forEach { it.isEnabled = enabled }
    }
}
