package org.harmonymobile.demo

import android.content.Context
import android.content.Intent
import android.content.RestrictionsManager
import android.graphics.Bitmap
import android.os.Bundle
import android.widget.ArrayAdapter
import androidx.activity.result.contract.ActivityResultContracts
import androidx.activity.viewModels
import androidx.appcompat.app.AppCompatActivity
import androidx.lifecycle.Lifecycle
import androidx.lifecycle.lifecycleScope
import androidx.lifecycle.repeatOnLifecycle
import java.util.Locale
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.harmonymobile.core.Classification
import org.harmonymobile.core.provisioning.ProvisioningPayload
import org.harmonymobile.core.queue.QueueFullException
import org.harmonymobile.demo.databinding.ActivityMainBinding

/**
 * The demo screen: the phone's tier, bundled sample digits and camera pictures classified on the phone
 * (early exit) or by the fallback server, local vs server answers with latency, and uploads of
 * user-confirmed labels through the sealed, durable queue. The loaded model lives in [DemoViewModel],
 * so a rotation does not reload it. The federation secret comes from provisioning only: a
 * `harmony-mobile://provision/v1#...` deep link (a QR code the camera app opens) or managed
 * configuration (`provisioning_payload`, res/xml/app_restrictions.xml); until then the screen says so.
 */
class MainActivity : AppCompatActivity() {
    private lateinit var binding: ActivityMainBinding
    private val model: DemoViewModel by viewModels()
    private var nextSample = 0
    private var lastResult: Classification? = null

    private val session: DemoSession? get() = (model.state.value as? DemoViewModel.State.Ready)?.session

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
        binding.serverUrlEdit.setText(model.credentials.serverUrl ?: BuildConfig.DEFAULT_SERVER_URL)

        binding.nextSampleButton.setOnClickListener { classifyNextSample() }
        binding.cameraButton.setOnClickListener { takePicture.launch(null) }
        binding.confirmButton.setOnClickListener { confirmLabel() }
        binding.flushButton.setOnClickListener { flushUploads() }
        binding.enrollButton.setOnClickListener { enroll() }
        binding.updateButton.setOnClickListener { model.checkForUpdate() }
        if (savedInstanceState == null) {
            provisionFrom(intent)
            managedProvisioning()?.let { model.provision(it) }
        }
        lifecycleScope.launch {
            repeatOnLifecycle(Lifecycle.State.STARTED) {
                launch { model.state.collect { render(it) } }
                launch { model.notice.collect { notice -> notice?.let { binding.statusText.text = it } } }
            }
        }
    }

    override fun onNewIntent(intent: Intent) {
        super.onNewIntent(intent)
        provisionFrom(intent)
    }

    /** A provisioning deep link (the payload is in the fragment, which is never sent anywhere). */
    private fun provisionFrom(intent: Intent?) {
        val link = intent?.dataString ?: return
        if (link.startsWith(ProvisioningPayload.URI_PREFIX)) {
            model.provision(link)
            intent.data = null // not again on a configuration change
        }
    }

    /** Android managed configuration (an MDM / EMM sets it): the same payload as the deep link. */
    private fun managedProvisioning(): String? {
        val restrictions = (getSystemService(Context.RESTRICTIONS_SERVICE) as? RestrictionsManager)?.applicationRestrictions
        return restrictions?.getString(ProvisioningPayload.MANAGED_CONFIG_KEY)?.takeIf { it.trim().isNotEmpty() }
    }

    private fun render(state: DemoViewModel.State) {
        setButtonsEnabled(state is DemoViewModel.State.Ready)
        when (state) {
            DemoViewModel.State.NotProvisioned -> {
                binding.tierText.text = getString(R.string.not_provisioned)
                binding.statusText.text = getString(R.string.not_provisioned_detail)
            }
            DemoViewModel.State.Loading -> binding.tierText.text = getString(R.string.loading)
            is DemoViewModel.State.Failed -> {
                binding.tierText.text = getString(R.string.no_model)
                binding.statusText.text = state.message
            }
            is DemoViewModel.State.Ready -> {
                showTier(state.session)
                refreshQueue()
            }
        }
    }

    private fun showTier(current: DemoSession) {
        val tier = current.model.tier
        binding.tierText.text = String.format(
            Locale.ROOT,
            "Tier %s (%s, split depth %d, %s, %s) for a %s phone, exit threshold %.3f, model %s (manifest %d)",
            tier.name(), tier.family(), tier.splitDepth(), current.model.artifact.quantization(), current.model.artifact.verdict(),
            current.model.deviceClass.name.lowercase(Locale.ROOT), tier.threshold(), current.model.manifest.modelVersion(),
            current.model.manifest.manifestVersion(),
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
        val ready = model.state.value as? DemoViewModel.State.Ready ?: return
        if (ready.samples.isEmpty()) return
        val sample = ready.samples[nextSample++ % ready.samples.size]
        // 28x28 gray digits feed any tier: resized and given the tier's channels
        classify(sample.image.fitTo(ready.session.model.tier), trueLabel = sample.label)
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
     * service (a provisioning payload can carry the enrolment instead). The result is kept in the Keystore.
     */
    private fun enroll() {
        val url = binding.serverUrlEdit.text.toString().trim()
        val adminToken = binding.adminTokenEdit.text.toString().trim()
        binding.adminTokenEdit.text.clear()
        model.enroll(url, adminToken)
    }

    private fun setButtonsEnabled(enabled: Boolean) {
        listOf(binding.nextSampleButton, binding.cameraButton, binding.confirmButton, binding.flushButton, binding.enrollButton,
            binding.updateButton)
            .forEach { it.isEnabled = enabled }
    }
}
