package org.harmonymobile.demo

import android.app.Application
import android.os.Build
import androidx.lifecycle.AndroidViewModel
import androidx.lifecycle.viewModelScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.asStateFlow
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.harmonymobile.core.provisioning.ProvisioningException
import org.harmonymobile.core.provisioning.ProvisioningPayload

/**
 * The screen's state, kept across configuration changes: a rotation re-creates the activity, not the
 * loaded model. The session is closed in [onCleared]; a session that finishes loading after the screen
 * went away (the scope was cancelled) is closed instead of leaked.
 */
class DemoViewModel(application: Application) : AndroidViewModel(application) {

    sealed interface State {
        /** No federation secret yet: nothing can be tokenized or decoded until the phone is provisioned. */
        data object NotProvisioned : State
        data object Loading : State
        data class Ready(val session: DemoSession, val samples: List<SampleDigit>) : State
        data class Failed(val message: String) : State
    }

    private val app = application
    val credentials = CredentialStore(application)
    private val _state = MutableStateFlow<State>(State.Loading)
    val state: StateFlow<State> = _state.asStateFlow()
    private val _notice = MutableStateFlow<String?>(null)
    val notice: StateFlow<String?> = _notice.asStateFlow()

    private val session: DemoSession? get() = (_state.value as? State.Ready)?.session

    init {
        start()
    }

    /** A deep link / QR code or managed configuration delivered a payload: verify, store, restart. */
    fun provision(text: String) {
        try {
            credentials.applyProvisioning(ProvisioningPayload.parse(text))
            _notice.value = "Provisioned: federation secret stored in the Keystore"
            start()
        } catch (bad: ProvisioningException) {
            _notice.value = "Provisioning refused: ${bad.message}"
        }
    }

    /** Verify and install the model, then wire the session (enrolled or local-only). */
    fun start(serverUrl: String? = null) {
        val federation = try {
            credentials.federationKey()
        } catch (unreadable: java.security.GeneralSecurityException) {
            // e.g. the Keystore key was invalidated: the phone must be provisioned again
            credentials.forgetProvisioning()
            null
        }
        if (federation == null) {
            replace(State.NotProvisioned)
            return
        }
        val url = serverUrl ?: credentials.serverUrl ?: BuildConfig.DEFAULT_SERVER_URL
        _state.value = State.Loading
        viewModelScope.launch {
            var created: DemoSession? = null
            try {
                val samples = withContext(Dispatchers.IO) {
                    val device = DeviceProfiler.capabilities(app)
                    val model = ModelInstaller(app, BuildConfig.PINNED_MANIFEST_KEY).install(device)
                    created = DemoSession(app, model, url, credentials.load(), federation, credentials.ownClasses())
                    SampleDigits.load(app)
                }
                replace(State.Ready(created!!, samples))
                created = null
            } catch (error: Exception) {
                if (error is kotlinx.coroutines.CancellationException) throw error
                replace(State.Failed("Model not loaded: ${error.message}"))
            } finally {
                created?.close() // built after the ViewModel was cleared (or failed later): not leaked
            }
        }
    }

    /** Fetch the server's signed manifest; a newer one (never an older one) is installed and switched to. */
    fun checkForUpdate() {
        val current = session ?: return
        val device = credentials.load() ?: run { _notice.value = "Enrol first: the manifest endpoints need a device token"; return }
        val url = credentials.serverUrl ?: BuildConfig.DEFAULT_SERVER_URL
        viewModelScope.launch {
            val outcome = withContext(Dispatchers.IO) {
                runCatching {
                    ModelInstaller(app, BuildConfig.PINNED_MANIFEST_KEY)
                        .update(DeviceProfiler.capabilities(app), url, device, BuildConfig.ARTIFACT_BASE_URL)
                }
            }
            outcome.onSuccess { (model, changed) ->
                _notice.value = if (changed) "Updated to model ${model.manifest.modelVersion()}" else "Model ${current.model.manifest.modelVersion()} is current"
                if (changed) start(url)
            }.onFailure { _notice.value = "Update refused: ${it.message}" }
        }
    }

    fun enroll(url: String, adminToken: String) {
        val current = session ?: return
        viewModelScope.launch {
            val outcome = withContext(Dispatchers.IO) {
                runCatching {
                    credentials.serverUrl = url
                    val enrollment = DemoSession.enroll(url, adminToken, "${Build.MANUFACTURER} ${Build.MODEL}", current.model.tier.name())
                    credentials.save(enrollment.credentials())
                    enrollment.deviceId()
                }
            }
            outcome.onSuccess { _notice.value = "Enrolled as $it"; start(url) }
                .onFailure { _notice.value = "Enrolment failed: ${it.message}" }
        }
    }

    fun note(message: String) {
        _notice.value = message
    }

    private fun replace(next: State) {
        val previous = session
        _state.value = next
        if (previous != null && previous !== (next as? State.Ready)?.session) previous.close()
    }

    override fun onCleared() {
        // A classification may still run: the engine is a SerializedEngine, so this waits for it.
        session?.close()
        super.onCleared()
    }
}
