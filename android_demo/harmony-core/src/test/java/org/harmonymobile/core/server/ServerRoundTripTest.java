package org.harmonymobile.core.server;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Clock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.harmonymobile.core.ConfirmedUploads;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.SlotDecoder;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.net.RetryPolicy;
import org.harmonymobile.core.net.RetryingTransport;
import org.harmonymobile.core.net.UrlConnectionTransport;
import org.harmonymobile.core.queue.UploadQueue;
import org.harmonymobile.core.seal.AssociatedData;
import org.harmonymobile.core.seal.TestEnvelopeOpener;
import org.harmonymobile.core.util.Hex;
import org.harmonymobile.core.wire.FeatureTensor;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client against a small in-JVM stand-in of the fallback server that follows docs/PROTOCOL.md:
 * it opens envelopes with the server key of the golden vectors and is idempotent on message ids.
 * (The real Python server is exercised by tests/test_android_interop.py.)
 */
class ServerRoundTripTest {
    private static final String ADMIN = "admin-secret";
    private static final String DEVICE_TOKEN = "device-token";
    private static final String EPOCH = "mnist5k-2026-11";
    private static final byte[] SECRET = Vectors.load("label_tokens.json").getHex("federation_secret");
    private static final List<String> CLASS_NAMES = List.of("0", "1", "2", "3", "4", "5", "6", "7", "8", "9");
    private final JsonObject keys = Vectors.load("sealed_upload.json");
    private final byte[] serverPrivate = keys.getHex("server_private_key");
    private final Map<String, String> stored = Collections.synchronizedMap(new LinkedHashMap<>());
    private final List<byte[]> openedPlaintexts = Collections.synchronizedList(new ArrayList<>());
    private final AtomicInteger uploadRequests = new AtomicInteger();
    private volatile int failNextUploads;
    private volatile boolean withBackend = true;
    private final AtomicInteger metadataRequests = new AtomicInteger();
    private final LabelTokens slotTokens = LabelTokens.forEpoch(SECRET, EPOCH);
    /** The stand-in back-end's slots: slot 0 = class "7", slot 1 = class "3", slot 2 = a class this phone lacks. */
    private final List<String> slotTable = List.of(
            Hex.encode(slotTokens.token("7")), Hex.encode(slotTokens.token("3")), Hex.encode(slotTokens.token("kangaroo")));
    private HttpServer server;

    @TempDir
    Path queueDir;

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        server.createContext("/v1/devices", exchange -> {
            byte[] raw = exchange.getRequestBody().readAllBytes();
            if (!("Bearer " + ADMIN).equals(exchange.getRequestHeaders().getFirst("Authorization"))) {
                exchange.getResponseHeaders().add("WWW-Authenticate", "Bearer");
                respond(exchange, 401, "{\"detail\":\"bad admin token\"}");
                return;
            }
            JsonObject request = Json.parseObject(new String(raw, StandardCharsets.UTF_8));
            Map<String, Object> body = new LinkedHashMap<>();
            body.put("device_id", "dev_" + request.getString("name"));
            body.put("token", DEVICE_TOKEN);
            body.put("server_public_key", Base64.getEncoder().encodeToString(keys.getHex("server_public_key")));
            body.put("seal_version", 1);
            body.put("model_name", "harmony-backend");
            body.put("default_version", withBackend ? "v1" : null);
            body.put("label_epoch", withBackend ? EPOCH : null);
            body.put("slot_table", withBackend ? slotTable : null);
            body.put("interface_shape", withBackend ? List.of(64, 8, 8) : null);
            body.put("manifest", null);
            body.put("manifest_signature", null);
            body.put("limits", Map.of("max_body_bytes", 8388608, "max_request_rows", 64, "max_upload_rows", 256,
                    "rate_limit_per_second", 50.0, "rate_limit_burst", 100));
            respond(exchange, 201, Json.write(body));
        });
        server.createContext("/v1/uploads", exchange -> {
            uploadRequests.incrementAndGet();
            JsonObject request = Json.parseObject(new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8));
            if (failNextUploads > 0) {
                failNextUploads--;
                exchange.getResponseHeaders().add("Retry-After", "0");
                respond(exchange, 503, "{\"detail\":\"busy\"}");
                return;
            }
            String messageId = request.getString("message_id");
            String envelope = request.getString("envelope");
            if (stored.containsKey(messageId)) {
                boolean same = stored.get(messageId).equals(envelope);
                respond(exchange, same ? 200 : 409, same ? receipt(messageId, true) : "{\"detail\":\"reused\"}");
                return;
            }
            try {
                AssociatedData ad = new AssociatedData("dev_pixel", request.getString("label_epoch"), UUID.fromString(messageId));
                openedPlaintexts.add(TestEnvelopeOpener.open(serverPrivate, Base64.getDecoder().decode(envelope), ad));
            } catch (Exception e) {
                respond(exchange, 400, "{\"detail\":\"envelope failed authentication\"}");
                return;
            }
            stored.put(messageId, envelope);
            respond(exchange, 201, receipt(messageId, false));
        });
        server.createContext("/v2/models/harmony-backend/infer", exchange -> {
            FeatureTensor features = FeatureTensor.decode(exchange.getRequestBody().readAllBytes());
            String tier = exchange.getRequestHeaders().getFirst("X-Harmony-Tier");
            assertEquals("application/octet-stream", exchange.getRequestHeaders().getFirst("Content-Type"));
            int rows = features.rows();
            List<Double> scores = new ArrayList<>();
            List<Long> top = new ArrayList<>();
            List<Double> confidence = new ArrayList<>();
            for (int r = 0; r < rows; r++) {
                int slot = r % 3; // row r answers slot r mod 3
                for (int c = 0; c < 3; c++) {
                    scores.add(c == slot ? 5.0 : 0.0);
                }
                top.add((long) slot);
                confidence.add(0.94);
            }
            respond(exchange, 200, Json.write(Map.of("model_name", "harmony-backend", "model_version", "v2-" + tier,
                    "outputs", List.of(
                            Map.of("name", "slot_scores", "datatype", "FP32", "shape", List.of(rows, 3), "data", scores),
                            Map.of("name", "top_slot", "datatype", "INT64", "shape", List.of(rows), "data", top),
                            Map.of("name", "confidence", "datatype", "FP32", "shape", List.of(rows), "data", confidence)))));
        });
        server.createContext("/v2/models/harmony-backend/versions/", exchange -> {
            metadataRequests.incrementAndGet();
            String version = exchange.getRequestURI().getPath().substring("/v2/models/harmony-backend/versions/".length());
            if (!version.startsWith("v2-")) {
                respond(exchange, 404, "{\"detail\":\"unknown version\"}");
                return;
            }
            respond(exchange, 200, Json.write(Map.of("name", "harmony-backend", "versions", List.of("v1", version),
                    "platform", "pytorch", "inputs", List.of(), "outputs", List.of(),
                    "parameters", Map.of("label_epoch", EPOCH, "slot_table", slotTable))));
        });
        server.start();
    }

    @AfterEach
    void stop() {
        server.stop(0);
    }

    private static String receipt(String messageId, boolean duplicate) {
        return "{\"upload_id\":1,\"message_id\":\"" + messageId + "\",\"rows\":1,\"duplicate\":" + duplicate
                + ",\"received_at\":\"2026-11-29T15:04:05Z\"}";
    }

    private static void respond(HttpExchange exchange, int status, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().add("Content-Type", "application/json");
        exchange.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(bytes);
        }
    }

    private HarmonyServerClient client() {
        UrlConnectionTransport http = new UrlConnectionTransport(
                "http://127.0.0.1:" + server.getAddress().getPort(), Duration.ofSeconds(2), Duration.ofSeconds(5));
        RetryPolicy policy = new RetryPolicy(3, Duration.ofMillis(1), 2, Duration.ofMillis(4), Duration.ofSeconds(1), new Random(3));
        return new HarmonyServerClient(new RetryingTransport(http, policy, d -> {}, Clock.systemUTC()));
    }

    @Test
    void enrolsAndRejectsABadAdminToken() throws Exception {
        Enrollment enrollment = client().enroll(ADMIN, "pixel", "mid-android");
        assertEquals("dev_pixel", enrollment.deviceId());
        assertArrayEquals(keys.getHex("server_public_key"), enrollment.serverPublicKey());
        assertEquals(null, enrollment.manifestText());
        assertEquals(256, enrollment.maxUploadRows());
        assertEquals("v1", enrollment.defaultVersion());
        assertEquals(new SlotTable(EPOCH, slotTable), enrollment.slotTable());
        assertEquals(EPOCH, enrollment.labelEpoch());
        ServerException e = assertThrows(ServerException.class, () -> client().enroll("wrong", "pixel", null));
        assertEquals(401, e.status());
        assertEquals("bad admin token", e.detail());
    }

    @Test
    void infersWithABinaryBody() throws Exception {
        DeviceCredentials device = client().enroll(ADMIN, "pixel", null).credentials();
        FeatureTensor features = new FeatureTensor(new float[2 * 64 * 8 * 8], new int[] {2, 64, 8, 8});
        List<ServerPrediction> predictions = client().infer(device, features, "mid-android", null);
        assertEquals(2, predictions.size());
        assertEquals(1, predictions.get(1).topSlot());
        assertEquals(5.0f, predictions.get(0).slotScores()[0]);
        assertEquals(3, predictions.get(0).slotScores().length);
        assertEquals("v2-mid-android", predictions.get(0).modelVersion());
    }

    @Test
    void enrolmentWithoutABackendHasNullVersionEpochAndSlots() throws Exception {
        withBackend = false;
        Enrollment enrollment = client().enroll(ADMIN, "pixel", null);
        assertEquals(null, enrollment.defaultVersion());
        assertEquals(null, enrollment.labelEpoch());
        assertEquals(null, enrollment.slotTable());
        assertEquals(null, enrollment.interfaceShape());
    }

    @Test
    void slotsOfAnotherVersionAreFetchedOnceThenDecodedToClasses() throws Exception {
        Enrollment enrollment = client().enroll(ADMIN, "pixel", null);
        DeviceCredentials device = enrollment.credentials();
        SlotDecoder decoder = new SlotDecoder(new FederationKey(SECRET), CLASS_NAMES, v -> client().slotTable(device, v));
        decoder.remember(enrollment.defaultVersion(), enrollment.slotTable()); // "v1"; answers come from "v2-..."
        FeatureTensor features = new FeatureTensor(new float[3 * 64 * 8 * 8], new int[] {3, 64, 8, 8});
        List<ServerPrediction> predictions = client().infer(device, features, "mid-android", null);
        assertEquals(7, decoder.classIndex(predictions.get(0)));
        assertEquals(3, decoder.classIndex(predictions.get(1)));
        assertEquals(-1, decoder.classIndex(predictions.get(2))); // "kangaroo" is none of this phone's classes
        assertEquals(1, metadataRequests.get());
        ServerException missing = assertThrows(ServerException.class, () -> client().slotTable(device, "v9"));
        assertEquals(404, missing.status());
        assertThrows(IllegalArgumentException.class, () -> client().slotTable(device, "../admin"));
    }

    @Test
    void confirmedUploadsAreSealedQueuedRetriedAndStoredOnce() throws Exception {
        DeviceCredentials device = client().enroll(ADMIN, "pixel", "mid-android").credentials();
        FederationKey key = new FederationKey(SECRET);
        UploadQueue queue = new UploadQueue(queueDir, 16, 1 << 20, UploadQueue.OverflowPolicy.REJECT_NEW);
        ConfirmedUploads uploads = new ConfirmedUploads(
                queue, client(), device, key, EPOCH, CLASS_NAMES, "mobilenet", "mid-android", 2, "v1");
        float[] values = new float[64 * 8 * 8];
        values[5] = 1.5f;
        uploads.enqueue(new FeatureTensor(values, new int[] {1, 64, 8, 8}), 4);
        uploads.enqueue(new FeatureTensor(values, new int[] {1, 64, 8, 8}), 9);

        failNextUploads = 5; // more 503s than the transport retries: the first flush delivers nothing
        assertEquals(0, uploads.flush());
        assertEquals(2, uploads.pending());
        assertEquals(2, uploads.flush());
        assertEquals(0, uploads.pending());
        assertEquals(2, stored.size());
        assertEquals(2, openedPlaintexts.size());
        String plaintext = new String(openedPlaintexts.get(0), StandardCharsets.ISO_8859_1);
        String token = Hex.encode(LabelTokens.forEpoch(SECRET, EPOCH).token("4"));
        assertTrue(plaintext.startsWith("HMUP"));
        assertTrue(plaintext.contains("\"label_tokens\":[\"" + token + "\"]"), plaintext.substring(0, 120));
        assertTrue(plaintext.contains("\"split_depths\":[2]"));
    }

    @Test
    void aReplayedUploadIsAcknowledgedAsDuplicate() throws Exception {
        DeviceCredentials device = client().enroll(ADMIN, "pixel", null).credentials();
        UploadQueue queue = new UploadQueue(queueDir, 16, 1 << 20, UploadQueue.OverflowPolicy.REJECT_NEW);
        ConfirmedUploads uploads = new ConfirmedUploads(queue, client(), device,
                new FederationKey(new byte[16]), "e1", CLASS_NAMES, "cnn", "entry-android", 1, "v1");
        uploads.enqueue(new FeatureTensor(new float[64 * 8 * 8], new int[] {1, 64, 8, 8}), 0);
        assertThrows(IllegalArgumentException.class,
                () -> uploads.enqueue(new FeatureTensor(new float[64 * 8 * 8], new int[] {1, 64, 8, 8}), 10));
        var pending = queue.pending().get(0);
        UploadReceipt first = client().upload(device, pending);
        UploadReceipt again = client().upload(device, pending);
        assertEquals(false, first.duplicate());
        assertEquals(true, again.duplicate());
        assertEquals(1, stored.size());
    }

    @Test
    void artifactsComeFromTheServerWithTheDeviceTokenAndAnErrorNamesTheServersSentence() throws Exception {
        byte[] pte = "PTE bytes".getBytes(StandardCharsets.UTF_8);
        List<String> targets = Collections.synchronizedList(new ArrayList<>());
        server.createContext(HarmonyServerClient.ARTIFACTS_PATH + "/", exchange -> {
            targets.add(exchange.getRequestURI().getRawPath());
            boolean known = exchange.getRequestURI().getPath().equals("/v1/artifacts/tiers/mid-android/front int8.pte");
            if (!("Bearer " + DEVICE_TOKEN).equals(exchange.getRequestHeaders().getFirst("Authorization")) || !known) {
                respond(exchange, 404, "{\"detail\":\"not an artifact of the served manifest\"}");
                return;
            }
            exchange.sendResponseHeaders(200, pte.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(pte);
            }
        });
        DeviceCredentials device = client().enroll(ADMIN, "pixel", null).credentials();
        try (var in = client().artifacts(device).open("tiers/mid-android/front int8.pte")) {
            assertArrayEquals(pte, in.readAllBytes());
        }
        assertEquals("/v1/artifacts/tiers/mid-android/front%20int8.pte", targets.get(0));
        IOException missing = assertThrows(IOException.class, () -> client().artifacts(device).open("other.pte"));
        assertTrue(missing.getMessage().contains("404: not an artifact of the served manifest"), missing.getMessage());
    }
}
