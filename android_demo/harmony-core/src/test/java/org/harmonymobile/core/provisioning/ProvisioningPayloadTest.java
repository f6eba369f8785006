package org.harmonymobile.core.provisioning;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.manifest.ManifestVerifier;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

/** The payloads export/provisioning.py writes (tests/vectors/provisioning_payloads.json), read as a phone does. */
class ProvisioningPayloadTest {
    private final JsonObject vectors = Vectors.load("provisioning_payloads.json");

    @Test
    void theConstantsAreThePythonOnes() {
        assertEquals(vectors.getString("uri_prefix"), ProvisioningPayload.URI_PREFIX);
        assertEquals(vectors.getString("managed_config_key"), ProvisioningPayload.MANAGED_CONFIG_KEY);
    }

    @Test
    void everyValidPayloadParsesToItsSecretServerAndDevice() throws Exception {
        List<JsonObject> cases = vectors.getObjectList("valid");
        assertEquals(4, cases.size());
        for (JsonObject c : cases) {
            ProvisioningPayload payload = ProvisioningPayload.parse(c.getString("payload"));
            assertArrayEquals(c.getHex("federation_secret_hex"), payload.federationSecret(), c.getString("name"));
            assertEquals(c.optString("server_url", null), payload.serverUrl(), c.getString("name"));
            JsonObject device = c.optObject("device");
            if (device == null) {
                assertNull(payload.device());
            } else {
                assertEquals(device.getString("device_id"), payload.device().deviceId());
                assertEquals(device.getString("token"), payload.device().token());
                assertArrayEquals(device.getHex("server_public_key_hex"), payload.device().serverPublicKey());
            }
            JsonObject own = c.optObject("own_classes");
            if (own == null) {
                assertTrue(payload.ownClasses().isEmpty(), c.getString("name"));
            } else {
                assertEquals(own.asMap(), payload.ownClasses(), c.getString("name"));
                String tier = own.asMap().keySet().iterator().next();
                assertEquals(own.asMap().get(tier), payload.ownClassesFor(tier).orElseThrow());
            }
            assertTrue(payload.ownClassesFor("no such tier").isEmpty());
        }
    }

    @Test
    void everyInvalidPayloadIsRefused() {
        List<JsonObject> cases = vectors.getObjectList("invalid");
        assertTrue(cases.size() >= 25);
        for (JsonObject c : cases) {
            assertThrows(ProvisioningException.class, () -> ProvisioningPayload.parse(c.getString("payload")),
                    c.getString("name"));
        }
        assertThrows(ProvisioningException.class, () -> ProvisioningPayload.parse(null));
    }

    @Test
    void thePlaceholderSecretIsNeverAccepted() {
        ProvisioningException error = assertThrows(ProvisioningException.class,
                () -> ProvisioningPayload.checkSecret("harmony demo federation secret!!!".getBytes(StandardCharsets.US_ASCII)));
        assertTrue(error.getMessage().contains("placeholder"));
    }

    @Test
    void theSecretNeverShowsInToString() throws Exception {
        ProvisioningPayload payload = ProvisioningPayload.parse(vectors.getObjectList("valid").get(1).getString("payload"));
        assertFalse(payload.toString().contains(Hex.encode(payload.federationSecret())));
        assertFalse(payload.toString().contains(payload.device().token()));
    }

    @Test
    void aSecretIsCheckedAgainstTheManifestsSlotTable() throws Exception {
        JsonObject signed = Vectors.load("manifest_signature.json");
        Manifest manifest = new ManifestVerifier(signed.getHex("public_key")).verify(
                signed.getString("manifest_text").getBytes(StandardCharsets.UTF_8),
                signed.getString("signature_file").getBytes(StandardCharsets.US_ASCII));
        byte[] golden = Vectors.load("label_tokens.json").getHex("federation_secret");
        SecretCheck.requireMatches(new FederationKey(golden), manifest);
        byte[] other = golden.clone();
        other[0] ^= 1;
        ProvisioningException wrong = assertThrows(ProvisioningException.class,
                () -> SecretCheck.requireMatches(new FederationKey(other), manifest));
        assertTrue(wrong.getMessage().contains("not this model's"));
    }
}
