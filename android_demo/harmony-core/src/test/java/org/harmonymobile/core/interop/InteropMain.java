package org.harmonymobile.core.interop;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.harmonymobile.core.Classification;
import org.harmonymobile.core.ConfirmedUploads;
import org.harmonymobile.core.ExitDecoder;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.HarmonyClient;
import org.harmonymobile.core.SlotDecoder;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.engine.FrontEndOutput;
import org.harmonymobile.core.engine.InferenceEngine;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.manifest.ManifestVerifier;
import org.harmonymobile.core.manifest.SignedManifest;
import org.harmonymobile.core.manifest.VariantChooser;
import org.harmonymobile.core.net.RetryPolicy;
import org.harmonymobile.core.net.RetryingTransport;
import org.harmonymobile.core.net.UrlConnectionTransport;
import org.harmonymobile.core.queue.PendingUpload;
import org.harmonymobile.core.queue.UploadQueue;
import org.harmonymobile.core.server.DeviceCredentials;
import org.harmonymobile.core.server.Enrollment;
import org.harmonymobile.core.server.HarmonyServerClient;
import org.harmonymobile.core.server.UploadReceipt;
import org.harmonymobile.core.update.ArtifactSource;
import org.harmonymobile.core.update.ModelStore;
import org.harmonymobile.core.util.Hex;
import org.harmonymobile.core.wire.FeatureTensor;

/**
 * The Java half of tests/test_android_interop.py: talks to a real `harmony serve` the way the app does
 * (enrol, verify the enrolment manifest, sealed confirmed-label uploads through the durable queue, a replay,
 * a fallback inference through {@link HarmonyClient}, its local exit answer named through the token order) and writes everything it sent as JSON, so the Python
 * side can check the server stored and answered exactly that.
 *
 * <pre>
 * java -cp target/classes:target/test-classes org.harmonymobile.core.interop.InteropMain \
 *     BASE_URL ADMIN_TOKEN PINNED_KEY_HEX PINNED_P256_KEY_HEX SECRET_HEX QUEUE_DIR OUT_JSON [EXPORT_DIR]
 * </pre>
 *
 * <p>With EXPORT_DIR (where the export is published), it also installs the server's manifest and
 * P-256 signature through {@link ModelStore}, as the Android app updates, twice (the second is a no-op).
 */
public final class InteropMain {
    private static final int[] ROW_SHAPE = {1, 64, 8, 8};
    private static final String TIER = "mid-android";
    private static final String FAMILY = "mobilenet";
    private static final int SPLIT_DEPTH = 2;
    private static final List<String> DIGITS = List.of("0", "1", "2", "3", "4", "5", "6", "7", "8", "9");

    private InteropMain() {}

    /** The server's signed manifest through the model store (P-256, as Android verifies), installed then re-offered. */
    private static Map<String, Object> update(HarmonyServerClient server, DeviceCredentials device, byte[] pinnedP256Key,
            Path exportDir, Path storeDir) throws Exception {
        ModelStore store = new ModelStore(storeDir, ManifestVerifier.p256(pinnedP256Key), "xnnpack", VariantChooser.PTE_PREFERENCE);
        ArtifactSource published = path -> Files.newInputStream(exportDir.resolve(path));
        SignedManifest signed = server.signedManifest(device, ManifestVerifier.P256_SIGNATURE_FILE);
        ModelStore.Installed installed = store.install(signed, published, m -> m.tier(TIER)).get();
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("manifest_version", installed.version().manifestVersion());
        result.put("manifest_sha256", installed.version().manifestSha256());
        result.put("artifact", installed.artifact().path());
        result.put("artifact_file_sha256", Hex.encode(Bytes.sha256(Files.readAllBytes(installed.file()))));
        result.put("second_install_changed", store.install(signed, published, m -> m.tier(TIER)).isPresent());
        return result;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 7 && args.length != 8) {
            System.err.println("usage: InteropMain BASE_URL ADMIN_TOKEN PINNED_KEY_HEX PINNED_P256_KEY_HEX SECRET_HEX QUEUE_DIR OUT_JSON [EXPORT_DIR]");
            System.exit(2);
        }
        String baseUrl = args[0];
        String adminToken = args[1];
        byte[] pinnedKey = Hex.decode(args[2]);
        byte[] pinnedP256Key = Hex.decode(args[3]);
        FederationKey federation = new FederationKey(Hex.decode(args[4]));
        Path queueDir = Path.of(args[5]);
        Path out = Path.of(args[6]);

        UrlConnectionTransport http = new UrlConnectionTransport(baseUrl, Duration.ofSeconds(5), Duration.ofSeconds(30));
        HarmonyServerClient server = new HarmonyServerClient(new RetryingTransport(http, RetryPolicy.defaults()));
        Map<String, Object> report = new LinkedHashMap<>();

        Enrollment enrollment = server.enroll(adminToken, "java-interop", TIER);
        DeviceCredentials device = enrollment.credentials();
        report.put("device_id", device.deviceId());
        report.put("server_public_key", Hex.encode(device.serverPublicKey()));
        report.put("default_version", enrollment.defaultVersion());
        report.put("label_epoch", enrollment.labelEpoch());
        report.put("slot_table", enrollment.slotTable() == null ? null : enrollment.slotTable().tokens());
        List<String> classNames = DIGITS;
        if (enrollment.manifestText() != null) {
            Manifest manifest = new ManifestVerifier(pinnedKey)
                    .verify(enrollment.manifestBytes(), enrollment.manifestSignatureFile());
            report.put("manifest_model_version", manifest.modelVersion());
            report.put("manifest_tiers", manifest.tiers().stream().map(t -> t.name()).toList());
            classNames = manifest.classNames();
        }
        if (enrollment.manifestP256SignatureFile() != null) {
            Manifest manifest = ManifestVerifier.p256(pinnedP256Key)
                    .verify(enrollment.manifestBytes(), enrollment.manifestP256SignatureFile());
            report.put("manifest_p256_model_version", manifest.modelVersion());
        }
        if (args.length == 8) {
            report.put("update", update(server, device, pinnedP256Key, Path.of(args[7]), queueDir.resolveSibling("model-store")));
        }

        // Two confirmed-label uploads through the durable queue, sealed to the enrolment key.
        UploadQueue queue = new UploadQueue(queueDir, 32, 1 << 22, UploadQueue.OverflowPolicy.REJECT_NEW);
        ConfirmedUploads uploads = new ConfirmedUploads(queue, server, device, federation, enrollment.labelEpoch(),
                classNames, FAMILY, TIER, SPLIT_DEPTH, "interop-v1");
        LabelTokens tokens = federation.tokens(enrollment.labelEpoch());
        int[] classes = {3, 8};
        List<Map<String, Object>> sent = new ArrayList<>();
        for (int i = 0; i < classes.length; i++) {
            FeatureTensor features = features(i + 1);
            String messageId = uploads.enqueue(features, classes[i]).upload().messageId();
            Map<String, Object> item = new LinkedHashMap<>();
            item.put("message_id", messageId);
            item.put("class_name", classNames.get(classes[i]));
            item.put("label_token", Hex.encode(tokens.token(classNames.get(classes[i]))));
            item.put("split_depth", SPLIT_DEPTH);
            item.put("shape", List.of(1, 64, 8, 8));
            item.put("features_f32le_base64", Base64.getEncoder().encodeToString(littleEndian(features.data())));
            sent.add(item);
        }
        List<PendingUpload> pending = queue.pending();
        for (int i = 0; i < pending.size(); i++) {
            byte[] envelope = Base64.getDecoder().decode(Json.parseObject(
                    new String(pending.get(i).body(), StandardCharsets.UTF_8)).getString("envelope"));
            sent.get(i).put("envelope_sha256", Hex.encode(Bytes.sha256(envelope)));
        }

        report.put("family", FAMILY);
        report.put("tier", TIER);
        report.put("model_version", "interop-v1");
        report.put("uploads", sent);
        report.put("delivered", uploads.flush());
        report.put("pending_after_flush", uploads.pending());

        // The app retries an upload whose answer it never saw: same body, same message id.
        UploadReceipt replay = server.upload(device, pending.get(0));
        report.put("replay_duplicate", replay.duplicate());
        report.put("replay_message_id", replay.messageId());

        // A low-confidence sample goes to the server; the answer comes back through HarmonyClient.
        FeatureTensor inferFeatures = features(7);
        InferenceEngine uncertain = new InferenceEngine() {
            @Override
            public FrontEndOutput run(float[] input) {
                return new FrontEndOutput(new float[] {0.1f, 0.2f, 0.0f, 0.15f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, inferFeatures);
            }

            @Override
            public void close() {}
        };
        SlotDecoder slots = new SlotDecoder(federation, classNames, version -> server.slotTable(device, version));
        ExitDecoder exits = new ExitDecoder(federation, enrollment.labelEpoch(), classNames);
        HarmonyClient client = new HarmonyClient(uncertain, new ExitPolicy(0.9), exits,
                features -> server.infer(device, features, TIER, null).get(0), slots);
        Classification answer = client.classify(new float[28 * 28]);
        Map<String, Object> inference = new LinkedHashMap<>();
        inference.put("source", answer.source().name());
        inference.put("predicted_class", answer.predictedClass());
        inference.put("confidence", answer.confidence());
        inference.put("local_top_output", answer.local().topOutput());
        inference.put("local_class", answer.localClass());
        inference.put("server_error", answer.serverError());
        if (answer.server() != null) {
            inference.put("model_version", answer.server().modelVersion());
            inference.put("slot_scores", answer.server().slotScores());
            inference.put("top_slot", answer.server().topSlot());
        }
        inference.put("features_f32le_base64", Base64.getEncoder().encodeToString(littleEndian(inferFeatures.data())));
        report.put("inference", inference);

        String json = Json.write(report);
        Files.writeString(out, json, StandardCharsets.UTF_8);
        System.out.println(json);
    }

    /** Deterministic, finite features that differ per seed. */
    private static FeatureTensor features(int seed) {
        float[] values = new float[64 * 8 * 8];
        for (int i = 0; i < values.length; i++) {
            values[i] = (float) Math.sin(seed * 0.37 + i * 0.011) * (1 + seed * 0.25f);
        }
        return new FeatureTensor(values, ROW_SHAPE);
    }

    private static byte[] littleEndian(float[] values) {
        ByteBuffer buffer = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        buffer.asFloatBuffer().put(values);
        return buffer.array();
    }
}
