package org.harmonymobile.core.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.net.HttpResponse;
import org.harmonymobile.core.wire.FeatureTensor;
import org.junit.jupiter.api.Test;

/**
 * The server writes its error sentence under {@code error} on /v2 routes and under {@code detail} on
 * /v1 routes (tests/vectors/error_bodies.json, from server/core/errors.py); the client shows that
 * sentence either way, and the body itself when whatever answered sent something else.
 */
class ErrorBodyVectorTest {
    private static final List<JsonObject> CASES = Vectors.load("error_bodies.json").getObjectList("cases");
    private static final DeviceCredentials DEVICE = new DeviceCredentials("dev_1", "token", new byte[32]);

    private static HttpResponse response(JsonObject vector) {
        return new HttpResponse(
                vector.getInt("status"),
                Map.of("Content-Type", List.of("application/json")),
                vector.getString("body").getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void everyVectorBodyGivesItsMessage() {
        assertTrue(CASES.size() >= 10);
        for (JsonObject vector : CASES) {
            ServerException error = HarmonyServerClient.error(response(vector));
            assertEquals(vector.getString("message"), error.detail(), vector.getString("name"));
            assertEquals(vector.getInt("status"), error.status(), vector.getString("name"));
        }
    }

    @Test
    void aV2InferErrorSurfacesTheServersSentence() {
        JsonObject vector = CASES.stream()
                .filter(c -> c.getString("name").equals("v2 infer, wrong shape"))
                .findFirst()
                .orElseThrow();
        HarmonyServerClient client = new HarmonyServerClient(request -> response(vector));
        FeatureTensor features = new FeatureTensor(new float[64 * 4 * 4], new int[] {1, 64, 4, 4});
        ServerException error = assertThrows(ServerException.class, () -> client.infer(DEVICE, features, null, null));
        assertEquals(422, error.status());
        assertEquals("input 'features' has shape [1, 64, 4, 4]; expected [N, 64, 8, 8]", error.detail());
    }
}
