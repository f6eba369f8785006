package org.harmonymobile.core.seal;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.List;
import java.util.UUID;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

class SealedUploadVectorTest {
    private final JsonObject vectors = Vectors.load("sealed_upload.json");
    private final byte[] serverPublic = vectors.getHex("server_public_key");
    private final byte[] serverPrivate = vectors.getHex("server_private_key");

    @Test
    void publicKeysDeriveLikePython() {
        assertEquals(vectors.getString("server_public_key"), Hex.encode(UploadSealer.publicKeyOf(serverPrivate)));
        assertEquals(vectors.getString("ephemeral_public_key"),
                Hex.encode(UploadSealer.publicKeyOf(vectors.getHex("ephemeral_private_key"))));
    }

    @Test
    void envelopesEqualPythonByteForByte() {
        List<JsonObject> cases = vectors.getObjectList("cases");
        assertEquals(3, cases.size());
        UploadSealer sealer = new UploadSealer(serverPublic);
        for (JsonObject c : cases) {
            AssociatedData ad = new AssociatedData(
                    c.getString("device_id"), c.getString("label_epoch"), UUID.fromString(c.getString("message_id")));
            assertEquals(c.getString("associated_data"), Hex.encode(ad.encode()), c.getString("name"));
            byte[] envelope = sealer.sealDeterministically(c.getHex("plaintext"), ad,
                    vectors.getHex("ephemeral_private_key"), vectors.getHex("nonce"));
            assertEquals(c.getString("envelope"), Hex.encode(envelope), c.getString("name"));
        }
    }

    @Test
    void productionSealingUsesFreshKeysAndOpensWithTheServerKey() throws Exception {
        AssociatedData ad = new AssociatedData("dev_1", "e3", UUID.randomUUID());
        byte[] plaintext = "features".getBytes();
        UploadSealer sealer = new UploadSealer(serverPublic);
        byte[] first = sealer.seal(plaintext, ad);
        byte[] second = sealer.seal(plaintext, ad);
        assertNotEquals(Hex.encode(first), Hex.encode(second));
        assertEquals(UploadSealer.HEADER_BYTES + plaintext.length + UploadSealer.TAG_BYTES, first.length);
        assertArrayEquals(plaintext, TestEnvelopeOpener.open(serverPrivate, first, ad));
        AssociatedData otherEpoch = new AssociatedData("dev_1", "e4", ad.messageId());
        assertThrows(javax.crypto.AEADBadTagException.class, () -> TestEnvelopeOpener.open(serverPrivate, first, otherEpoch));
    }

    @Test
    void associatedDataValidatesItsFields() {
        UUID id = UUID.randomUUID();
        assertThrows(IllegalArgumentException.class, () -> new AssociatedData("", "e0", id));
        assertThrows(IllegalArgumentException.class, () -> new AssociatedData("x".repeat(256), "e0", id));
        assertThrows(IllegalArgumentException.class, () -> new AssociatedData("d", "", id));
        assertThrows(IllegalArgumentException.class, () -> new AssociatedData("d", "x".repeat(65), id));
        assertThrows(IllegalArgumentException.class, () -> new AssociatedData("d", "e 1", id));
        assertThrows(IllegalArgumentException.class, () -> new UploadSealer(new byte[31]));
    }
}
