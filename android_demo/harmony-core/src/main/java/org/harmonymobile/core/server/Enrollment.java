package org.harmonymobile.core.server;

import java.nio.charset.StandardCharsets;
import org.harmonymobile.core.json.JsonObject;

/**
 * The answer to {@code POST /v1/devices} (docs/PROTOCOL.md 2). The token is shown once: store it
 * in the Android Keystore. {@code manifestText} and {@code manifestSignatureFile} are null when the
 * server has no manifest; otherwise verify them with {@code ManifestVerifier} before use.
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
        long[] interfaceShape,
        String manifestText,
        String manifestSignatureText,
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
                json.getString("default_version"),
                json.getLongArray("interface_shape"),
                json.has("manifest") ? json.getString("manifest") : null,
                json.has("manifest_signature") ? json.getString("manifest_signature") : null,
                limits.getInt("max_upload_rows"),
                limits.getInt("max_request_rows"),
                limits.getLong("max_body_bytes"));
    }

    /** The manifest's UTF-8 bytes, which its Ed25519 signature covers; null without a manifest. */
    public byte[] manifestBytes() {
        return manifestText == null ? null : manifestText.getBytes(StandardCharsets.UTF_8);
    }

    /** The manifest.sig file content (base64 text) the verifier reads; null without a manifest. */
    public byte[] manifestSignatureFile() {
        return manifestSignatureText == null ? null : manifestSignatureText.getBytes(StandardCharsets.US_ASCII);
    }

    public DeviceCredentials credentials() {
        return new DeviceCredentials(deviceId, token, serverPublicKey);
    }
}
