package org.harmonymobile.core;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.engine.FrontEndOutput;
import org.harmonymobile.core.engine.InferenceEngine;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.server.ServerPrediction;
import org.harmonymobile.core.server.SlotTable;
import org.harmonymobile.core.util.Hex;
import org.harmonymobile.core.wire.FeatureTensor;
import org.junit.jupiter.api.Test;

class HarmonyClientTest {
    private static final FeatureTensor FEATURES = new FeatureTensor(new float[64 * 8 * 8], new int[] {1, 64, 8, 8});

    /** An engine that returns fixed logits, ignoring its input. */
    private record FixedEngine(float[] logits) implements InferenceEngine {
        @Override
        public FrontEndOutput run(float[] input) {
            return new FrontEndOutput(logits, FEATURES);
        }

        @Override
        public void close() {}
    }

    private final AtomicLong clock = new AtomicLong();
    private final AtomicInteger serverCalls = new AtomicInteger();

    private static final byte[] SECRET = new byte[32];
    private static final String EPOCH = "e1";
    private static final List<String> CLASS_NAMES = List.of("0", "1", "2", "3", "4", "5", "6", "7", "8", "9");
    /** Version v1's slots: slot s holds class "9 - s", then one slot of a class this phone does not know. */
    private static final SlotTable SLOTS = slotTable();

    private static SlotTable slotTable() {
        LabelTokens tokens = LabelTokens.forEpoch(SECRET, EPOCH);
        List<String> table = new ArrayList<>();
        for (int s = 0; s < 10; s++) {
            table.add(Hex.encode(tokens.token(CLASS_NAMES.get(9 - s))));
        }
        table.add(Hex.encode(tokens.token("zebra")));
        return new SlotTable(EPOCH, table);
    }

    private final AtomicInteger tableFetches = new AtomicInteger();

    private HarmonyClient client(float[] logits, FallbackServer server) {
        SlotDecoder decoder = new SlotDecoder(new FederationKey(SECRET), CLASS_NAMES, version -> {
            tableFetches.incrementAndGet();
            return SLOTS;
        });
        return new HarmonyClient(new FixedEngine(logits), new ExitPolicy(0.9), server, decoder,
                () -> clock.addAndGet(1_000_000));
    }

    private FallbackServer answering(int topSlot) {
        return features -> {
            serverCalls.incrementAndGet();
            assertSame(FEATURES, features);
            return new ServerPrediction("v1", new float[11], topSlot, 0.8);
        };
    }

    @Test
    void confidentSamplesAreAnsweredLocallyWithoutTheServer() throws Exception {
        Classification c = client(new float[] {9f, 0f, 0f}, answering(2)).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_EXIT, c.source());
        assertEquals(0, c.predictedClass());
        assertTrue(c.confidence() > 0.99);
        assertEquals(0, serverCalls.get());
        assertEquals(1_000_000, c.localLatencyNanos());
        assertNull(c.server());
    }

    @Test
    void uncertainSamplesFallBackToTheServer() throws Exception {
        Classification c = client(new float[] {1f, 1.2f, 0f}, answering(2)).classify(new float[784]);
        assertEquals(Classification.Source.SERVER, c.source());
        assertEquals(7, c.predictedClass()); // slot 2 holds class "7"
        assertEquals(0.8, c.confidence());
        assertEquals(1, c.local().predictedClass());
        assertEquals(1, serverCalls.get());
        assertEquals(1_000_000, c.serverLatencyNanos());
        assertEquals(1, tableFetches.get());
    }

    @Test
    void aSlotWithNoClassOfThisPhoneKeepsTheLocalAnswerAndSaysSo() throws Exception {
        Classification c = client(new float[] {1f, 1.2f, 0f}, answering(10)).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_SERVER_UNNAMED, c.source());
        assertEquals(1, c.predictedClass());
        assertEquals(10, c.server().topSlot());
        assertTrue(c.serverError().contains("slot 10"));
    }

    @Test
    void aFallbackServerNeedsASlotDecoder() {
        assertThrows(IllegalArgumentException.class,
                () -> new HarmonyClient(new FixedEngine(new float[] {1f}), new ExitPolicy(0.9), answering(0), null));
    }

    @Test
    void serverFailuresStillGetTheLocalAnswer() throws Exception {
        FallbackServer busy = features -> {
            throw new ServerException(503, "inference queue full", java.time.Duration.ofSeconds(1));
        };
        Classification c = client(new float[] {1f, 1.2f, 0f}, busy).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, c.source());
        assertEquals(1, c.predictedClass());
        assertTrue(c.serverError().contains("503"));

        FallbackServer offline = features -> {
            throw new IOException("connection refused");
        };
        assertEquals(1, client(new float[] {1f, 1.2f, 0f}, offline).classify(new float[784]).predictedClass());

        Classification noServer = client(new float[] {1f, 1.2f, 0f}, null).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, noServer.source());
        assertEquals("no fallback server configured", noServer.serverError());
    }
}
