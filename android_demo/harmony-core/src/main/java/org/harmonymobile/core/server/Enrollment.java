package org.harmonymobile.core.server;

import java.nio.charset.StandardCharsets;
import org.harmonymobile.core.json.JsonObject;

/**
 * The answer to {@code POST /v1/devices} (docs/PROTOCOL.md 2). The token is shown once: store it
 * in the Android Keystore. {@code manifestText} and {@code manifestSignatureFile} are null when the
 * server has no manifest; otherwise verify them with {@code ManifestVerifier} before use.
 *
 * <p>{@code defaultVersion}, {@code labelEpoch}, {@code slotTable} and {@code interfaceShape} are null
 * while the server has no back-end loaded: the phone then answers locally and cannot upload yet
 * (uploads name the label epoch).
 *
 * <p>{@code manifest_signature} is taken to be the manifest.sig file content verbatim (itself base64
 * of the 64-byte signature), which is what the Python server sends; the verifier decodes it.
 */
public record Enrollment(
        String deviceId,
        String token,
        byte[] serverPublicKey,
        int sealVersion,
        String modelName,
        String defaultVersion,
        String labelEpoch,
        SlotTable slotTable,
        long[] interfaceShape,
        String manifestText,
        String manifestSignatureText,
        String manifestP256SignatureText,
        int maxUploadRows,
        int maxRequestRows,
        long maxBodyBytes) {

    static Enrollment from(JsonObject json) {
        JsonObject limits = json.getObject("limits");
        return new Enrollment(
                json.getString("device_id"),
                json.getString("token"),
                json.getBase64("server_public_key"),
                json.getInt("seal_version"),
                json.getString("model_name"),
                json.optString("default_version", null),
                json.optString("label_epoch", null),
                SlotTable.fromJson(json),
                json.has("interface_shape") ? json.getLongArray("interface_shape") : null,
                json.has("manifest") ? json.getString("manifest") : null,
                json.has("manifest_signature") ? json.getString("manifest_signature") : null,
                json.optString("manifest_p256_signature", null),
                limits.getInt("max_upload_rows"),
                limits.getInt("max_request_rows"),
                limits.getLong("max_body_bytes"));
    }

    /** The manifest's UTF-8 bytes, which its signatures cover; null without a manifest. */
    public byte[] manifestBytes() {
        return manifestText == null ? null : manifestText.getBytes(StandardCharsets.UTF_8);
    }

    /** The manifest.sig file content (base64 text) the verifier reads; null without a manifest. */
    public byte[] manifestSignatureFile() {
        return manifestSignatureText == null ? null : manifestSignatureText.getBytes(StandardCharsets.US_ASCII);
    }

    /** The manifest.p256.sig file content (what Android verifies); null without one. */
    public byte[] manifestP256SignatureFile() {
        return manifestP256SignatureText == null ? null : manifestP256SignatureText.getBytes(StandardCharsets.US_ASCII);
    }

    public DeviceCredentials credentials() {
        return new DeviceCredentials(deviceId, token, serverPublicKey);
    }
}
