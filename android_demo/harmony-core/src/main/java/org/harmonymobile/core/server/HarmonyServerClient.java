package org.harmonymobile.core.server;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.manifest.ManifestVerifier;
import org.harmonymobile.core.manifest.SignedManifest;
import org.harmonymobile.core.net.HttpRequest;
import org.harmonymobile.core.net.HttpResponse;
import org.harmonymobile.core.net.HttpTransport;
import org.harmonymobile.core.net.RetryAfter;
import org.harmonymobile.core.queue.PendingUpload;
import org.harmonymobile.core.update.ArtifactSource;
import org.harmonymobile.core.wire.FeatureTensor;

/**
 * The fallback server's API as docs/PROTOCOL.md defines it: enrolment, binary-body inference and
 * sealed uploads. Retries belong to the transport (wrap it in a {@code RetryingTransport}).
 */
public final class HarmonyServerClient {
    public static final String MODEL_NAME = "harmony-backend";
    /** The default artifact base, on the server itself (docs/PROTOCOL.md 2.4). */
    public static final String ARTIFACTS_PATH = "/v1/artifacts";
    private static final String JSON = "application/json";
    private static final String BINARY = "application/octet-stream";
    private static final List<String> ERROR_KEYS = List.of("error", "detail");

    private final HttpTransport transport;

    public HarmonyServerClient(HttpTransport transport) {
        this.transport = transport;
    }

    /** {@code POST /v1/devices} with the admin token (a provisioning step, not something a phone does in the field). */
    public Enrollment enroll(String adminToken, String name, String tier) throws IOException, ServerException {
        Map<String, Object> body = new LinkedHashMap<>();
        if (name != null) {
            body.put("name", name);
        }
        if (tier != null) {
            body.put("tier", tier);
        }
        HttpResponse response = send(HttpRequest.post("/v1/devices", bearer(adminToken), JSON, utf8(Json.write(body))));
        return parse(response, Enrollment::from);
    }

    /**
     * {@code POST /v2/models/harmony-backend[/versions/{v}]/infer} with an HMFT body; one prediction per row.
     *
     * @param version a registry version, or null for the server's default
     */
    public List<ServerPrediction> infer(DeviceCredentials device, FeatureTensor features, String tier, String version)
            throws IOException, ServerException {
        String path = "/v2/models/" + MODEL_NAME + (version == null ? "" : "/versions/" + version) + "/infer";
        Map<String, String> headers = new LinkedHashMap<>(bearer(device.token()));
        if (tier != null) {
            headers.put("X-Harmony-Tier", tier);
        }
        HttpResponse response = send(HttpRequest.post(path, headers, BINARY, features.encode()));
        return parse(response, HarmonyServerClient::predictions);
    }

    /**
     * {@code GET /v2/models/harmony-backend/versions/{v}}: the version's slot table from the metadata's
     * {@code parameters}, needed when an inference answer names a version this phone has no table for.
     */
    public SlotTable slotTable(DeviceCredentials device, String version) throws IOException, ServerException {
        HttpResponse response = send(HttpRequest.get(
                "/v2/models/" + MODEL_NAME + "/versions/" + pathSegment(version), bearer(device.token())));
        return parse(response, json -> {
            SlotTable table = SlotTable.fromJson(json.optObject("parameters"));
            if (table == null) {
                throw new JsonException("model metadata of version " + version + " carries no slot table");
            }
            return table;
        });
    }

    /**
     * {@code GET /v1/manifest} and the signature file the verifier reads ({@code /v1/manifest.sig} or
     * {@code /v1/manifest.p256.sig}): the server's current export, unverified (ModelStore verifies it).
     */
    public SignedManifest signedManifest(DeviceCredentials device, String signatureFile) throws IOException, ServerException {
        byte[] manifest = body(send(HttpRequest.get("/v1/manifest", bearer(device.token()))));
        byte[] signature = body(send(HttpRequest.get("/v1/" + pathSegment(signatureFile), bearer(device.token()))));
        return new SignedManifest(manifest, signature);
    }

    /**
     * {@code GET /v1/artifacts/{path}} with the device token: the server's copy of each manifest path
     * (docs/PROTOCOL.md 2.4), for {@code ModelStore.install}, which checks every file against the
     * signed manifest. An error answer is an IOException carrying the server's sentence.
     */
    public ArtifactSource artifacts(DeviceCredentials device) {
        return path -> {
            HttpResponse response = send(HttpRequest.get(artifactTarget(path), bearer(device.token())));
            if (!response.isSuccess()) {
                throw new IOException("GET " + ARTIFACTS_PATH + "/" + path + ": " + error(response).getMessage());
            }
            return new ByteArrayInputStream(response.body());
        };
    }

    /** The request target of a manifest path: each '/'-separated segment percent-encoded (RFC 3986). */
    static String artifactTarget(String path) {
        StringBuilder target = new StringBuilder(ARTIFACTS_PATH);
        for (String segment : path.split("/", -1)) {
            target.append('/');
            for (byte b : segment.getBytes(StandardCharsets.UTF_8)) {
                char c = (char) (b & 0xff);
                boolean unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                        || c == '-' || c == '.' || c == '_' || c == '~';
                target.append(unreserved ? String.valueOf(c) : String.format("%%%02X", b & 0xff));
            }
        }
        return target.toString();
    }

    private static byte[] body(HttpResponse response) throws ServerException {
        if (!response.isSuccess()) {
            throw error(response);
        }
        return response.body();
    }

    /** The exact JSON body of {@code POST /v1/uploads}; it is what the upload queue stores and resends. */
    public static byte[] uploadBody(String labelEpoch, String messageId, byte[] envelope) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("label_epoch", LabelTokens.checkLabelEpoch(labelEpoch));
        body.put("message_id", messageId);
        body.put("envelope", Base64.getEncoder().encodeToString(envelope));
        return utf8(Json.write(body));
    }

    /** Sends a queued upload body; 201 (stored) and 200 (replay of a stored message id) both acknowledge. */
    public UploadReceipt upload(DeviceCredentials device, PendingUpload upload) throws IOException, ServerException {
        HttpResponse response = send(HttpRequest.post("/v1/uploads", bearer(device.token()), JSON, upload.body()));
        return parse(response, json -> new UploadReceipt(
                json.getLong("upload_id"), json.getString("message_id"), json.getInt("rows"), json.getBoolean("duplicate")));
    }

    private HttpResponse send(HttpRequest request) throws IOException {
        return transport.execute(request);
    }

    private interface Parser<T> {
        T parse(JsonObject json);
    }

    private static <T> T parse(HttpResponse response, Parser<T> parser) throws ServerException, IOException {
        if (!response.isSuccess()) {
            throw error(response);
        }
        try {
            return parser.parse(response.json());
        } catch (JsonException e) {
            throw new IOException("malformed server response: " + e.getMessage(), e);
        }
    }

    static ServerException error(HttpResponse response) {
        return new ServerException(response.status(), errorMessage(response.bodyText()),
                RetryAfter.parse(response.header("Retry-After"), Clock.systemUTC()).orElse(null));
    }

    /**
     * The server's sentence: a string {@code error} (the /v2 routes, as the V2 inference protocol
     * has it), else a string {@code detail} (the /v1 routes), else the body itself (a proxy's page).
     */
    static String errorMessage(String body) {
        try {
            JsonObject json = Json.parseObject(body);
            for (String key : ERROR_KEYS) {
                if (json.has(key) && json.get(key) instanceof String message) {
                    return message;
                }
            }
        } catch (JsonException notAnObject) {
            // fall through: show what the server (or whatever answered) sent
        }
        return body;
    }

    private static List<ServerPrediction> predictions(JsonObject json) {
        String version = json.getString("model_version");
        Map<String, JsonObject> outputs = new LinkedHashMap<>();
        for (JsonObject output : json.getObjectList("outputs")) {
            outputs.put(output.getString("name"), output);
        }
        JsonObject scores = require(outputs, "slot_scores");
        long[] shape = scores.getLongArray("shape");
        if (shape.length != 2) {
            throw new JsonException("slot_scores must have shape [N, S], got " + shape.length + " dimensions");
        }
        double[] scoreData = scores.getDoubleArray("data");
        long[] topSlot = require(outputs, "top_slot").getLongArray("data");
        double[] confidence = require(outputs, "confidence").getDoubleArray("data");
        int rows = (int) shape[0];
        int slots = (int) shape[1];
        if (scoreData.length != rows * slots || topSlot.length != rows || confidence.length != rows) {
            throw new JsonException("inference outputs disagree on the number of rows");
        }
        List<ServerPrediction> out = new ArrayList<>();
        for (int r = 0; r < rows; r++) {
            float[] row = new float[slots];
            for (int c = 0; c < slots; c++) {
                row[c] = (float) scoreData[r * slots + c];
            }
            if (topSlot[r] < 0 || topSlot[r] >= slots) {
                throw new JsonException("top_slot " + topSlot[r] + " is not one of the " + slots + " slots");
            }
            out.add(new ServerPrediction(version, row, (int) topSlot[r], confidence[r]));
        }
        return out;
    }

    private static JsonObject require(Map<String, JsonObject> outputs, String name) {
        JsonObject output = outputs.get(name);
        if (output == null) {
            throw new JsonException("inference response lacks output \"" + name + "\"");
        }
        return output;
    }

    private static String pathSegment(String version) {
        if (version == null || !version.matches("[A-Za-z0-9._-]{1,128}")) {
            throw new IllegalArgumentException("a model version is 1-128 characters of [A-Za-z0-9._-], got " + version);
        }
        return version;
    }

    private static Map<String, String> bearer(String token) {
        return Map.of("Authorization", "Bearer " + token);
    }

    private static byte[] utf8(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
