package org.harmonymobile.demo

import android.content.Context
import android.security.keystore.KeyGenParameterSpec
import android.security.keystore.KeyProperties
import android.util.Base64
import java.security.KeyStore
import javax.crypto.Cipher
import javax.crypto.KeyGenerator
import javax.crypto.SecretKey
import javax.crypto.spec.GCMParameterSpec
import org.harmonymobile.core.FederationKey
import org.harmonymobile.core.json.Json
import org.harmonymobile.core.provisioning.ProvisioningPayload
import org.harmonymobile.core.server.DeviceCredentials

/**
 * Keeps what the phone was provisioned with and the enrolment result. The federation secret and the
 * bearer token are encrypted with an AES-256-GCM key that lives in the Android Keystore
 * (non-exportable); only those ciphertexts, the device id and the pinned server X25519 key are in the
 * app's private preferences (excluded from backups: allowBackup="false"). Nothing secret ships in the
 * APK: the secret arrives through [applyProvisioning] (docs/PROVISIONING.md).
 */
class CredentialStore(context: Context) {
    private val prefs = context.getSharedPreferences("harmony_device", Context.MODE_PRIVATE)

    var serverUrl: String?
        get() = prefs.getString(KEY_SERVER_URL, null)
        set(value) = prefs.edit().putString(KEY_SERVER_URL, value).apply()

    fun save(credentials: DeviceCredentials) {
        val cipher = Cipher.getInstance(TRANSFORMATION).apply { init(Cipher.ENCRYPT_MODE, keystoreKey()) }
        val sealedToken = cipher.doFinal(credentials.token().toByteArray(Charsets.UTF_8))
        prefs.edit()
            .putString(KEY_DEVICE_ID, credentials.deviceId())
            .putString(KEY_TOKEN_IV, encode(cipher.iv))
            .putString(KEY_TOKEN, encode(sealedToken))
            .putString(KEY_SERVER_PUBLIC, encode(credentials.serverPublicKey()))
            .commit()
    }

    /**
     * Stores a verified provisioning payload: the secret and the classes each tier's phone holds (sealed:
     * both are the owner's, not the operator's), and the server URL and enrolment it names.
     */
    fun applyProvisioning(payload: ProvisioningPayload) {
        val (iv, sealed) = seal(payload.federationSecret())
        val (ownIv, ownSealed) = seal(Json.write(payload.ownClasses()).toByteArray(Charsets.UTF_8))
        prefs.edit()
            .putString(KEY_SECRET_IV, encode(iv)).putString(KEY_SECRET, encode(sealed))
            .putString(KEY_OWN_CLASSES_IV, encode(ownIv)).putString(KEY_OWN_CLASSES, encode(ownSealed))
            .commit()
        payload.serverUrl()?.let { serverUrl = it }
        payload.device()?.let { save(it) }
    }

    /** Tier name -> the classes its phone holds, as the payload named them (empty when it named none). */
    fun ownClasses(): Map<String, List<String>> {
        val iv = decode(prefs.getString(KEY_OWN_CLASSES_IV, null) ?: return emptyMap())
        val sealed = decode(prefs.getString(KEY_OWN_CLASSES, null) ?: return emptyMap())
        return Json.parseObject(String(open(iv, sealed), Charsets.UTF_8)).asMap()
            .mapValues { (_, classes) -> (classes as List<*>).map { it as String } }
    }

    /** The provisioned label-token key, or null: the app then tokenizes and decodes nothing. */
    fun federationKey(): FederationKey? {
        val iv = decode(prefs.getString(KEY_SECRET_IV, null) ?: return null)
        val sealed = decode(prefs.getString(KEY_SECRET, null) ?: return null)
        return FederationKey(open(iv, sealed))
    }

    fun forgetProvisioning() {
        prefs.edit().remove(KEY_SECRET).remove(KEY_SECRET_IV).remove(KEY_OWN_CLASSES).remove(KEY_OWN_CLASSES_IV).apply()
    }

    private fun seal(plaintext: ByteArray): Pair<ByteArray, ByteArray> {
        val cipher = Cipher.getInstance(TRANSFORMATION).apply { init(Cipher.ENCRYPT_MODE, keystoreKey()) }
        return cipher.iv to cipher.doFinal(plaintext)
    }

    private fun open(iv: ByteArray, sealed: ByteArray): ByteArray =
        Cipher.getInstance(TRANSFORMATION)
            .apply { init(Cipher.DECRYPT_MODE, keystoreKey(), GCMParameterSpec(128, iv)) }
            .doFinal(sealed)

    fun load(): DeviceCredentials? {
        val deviceId = prefs.getString(KEY_DEVICE_ID, null) ?: return null
        val iv = decode(prefs.getString(KEY_TOKEN_IV, null) ?: return null)
        val sealedToken = decode(prefs.getString(KEY_TOKEN, null) ?: return null)
        val serverPublic = decode(prefs.getString(KEY_SERVER_PUBLIC, null) ?: return null)
        val cipher = Cipher.getInstance(TRANSFORMATION)
            .apply { init(Cipher.DECRYPT_MODE, keystoreKey(), GCMParameterSpec(128, iv)) }
        val token = String(cipher.doFinal(sealedToken), Charsets.UTF_8)
        return DeviceCredentials(deviceId, token, serverPublic)
    }

    fun clear() {
        prefs.edit().remove(KEY_DEVICE_ID).remove(KEY_TOKEN).remove(KEY_TOKEN_IV).remove(KEY_SERVER_PUBLIC).apply()
    }

    private fun keystoreKey(): SecretKey {
        val keyStore = KeyStore.getInstance(ANDROID_KEYSTORE).apply { load(null) }
        (keyStore.getKey(KEY_ALIAS, null) as? SecretKey)?.let { return it }
        val generator = KeyGenerator.getInstance(KeyProperties.KEY_ALGORITHM_AES, ANDROID_KEYSTORE)
        generator.init(
            KeyGenParameterSpec.Builder(KEY_ALIAS, KeyProperties.PURPOSE_ENCRYPT or KeyProperties.PURPOSE_DECRYPT)
                .setBlockModes(KeyProperties.BLOCK_MODE_GCM)
                .setEncryptionPaddings(KeyProperties.ENCRYPTION_PADDING_NONE)
                .setKeySize(256)
                .build(),
        )
        return generator.generateKey()
    }

    private companion object {
        const val ANDROID_KEYSTORE = "AndroidKeyStore"
        const val KEY_ALIAS = "harmony-device-token"
        const val TRANSFORMATION = "AES/GCM/NoPadding"
        const val KEY_SERVER_URL = "server_url"
        const val KEY_DEVICE_ID = "device_id"
        const val KEY_TOKEN = "token_sealed"
        const val KEY_TOKEN_IV = "token_iv"
        const val KEY_SERVER_PUBLIC = "server_public_key"
        const val KEY_SECRET = "federation_secret_sealed"
        const val KEY_SECRET_IV = "federation_secret_iv"
        const val KEY_OWN_CLASSES = "own_classes_sealed"
        const val KEY_OWN_CLASSES_IV = "own_classes_iv"

        fun encode(bytes: ByteArray): String = Base64.encodeToString(bytes, Base64.NO_WRAP)
        fun decode(text: String): ByteArray = Base64.decode(text, Base64.NO_WRAP)
    }
}
