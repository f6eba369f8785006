package org.harmonymobile.core;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.engine.FrontEndOutput;
import org.harmonymobile.core.engine.InferenceEngine;
import org.harmonymobile.core.engine.InferenceException;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.exit.SlotGatePolicy;
import org.harmonymobile.core.json.JsonObject;
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

    /** exit_order.json's "digits" case: its secret and epoch, and (from Python) the class of each exit output. */
    private static final JsonObject DIGITS = Vectors.load("exit_order.json").getObjectList("cases").get(0);
    private static final byte[] SECRET = Vectors.load("exit_order.json").getHex("federation_secret");
    private static final String EPOCH = DIGITS.getString("label_epoch");
    private static final List<String> CLASS_NAMES = List.of("0", "1", "2", "3", "4", "5", "6", "7", "8", "9");
    private static final List<String> EXIT_CLASSES = DIGITS.getStringList("exit_classes");
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
        return new HarmonyClient(new FixedEngine(logits), new ExitPolicy(0.9), exits(), server, decoder,
                () -> clock.addAndGet(1_000_000));
    }

    private static ExitDecoder exits() {
        return new ExitDecoder(new FederationKey(SECRET), EPOCH, CLASS_NAMES);
    }

    /** Ten exit logits, {@code value} at output {@code top} and 0 elsewhere. */
    private static float[] logits(int top, float value) {
        float[] out = new float[CLASS_NAMES.size()];
        out[top] = value;
        return out;
    }

    /** The class index Python's exit_order gives exit output {@code j}. */
    private static int exitClass(int j) {
        return CLASS_NAMES.indexOf(EXIT_CLASSES.get(j));
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
        Classification c = client(logits(0, 9f), answering(2)).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_EXIT, c.source());
        assertEquals(0, c.local().topOutput());
        assertEquals(9, c.predictedClass()); // exit output 0 is class "9" (the smallest token)
        assertEquals(9, c.localClass());
        assertTrue(c.confidence() > 0.99);
        assertEquals(0, serverCalls.get());
        assertEquals(1_000_000, c.localLatencyNanos());
        assertNull(c.server());
    }

    @Test
    void uncertainSamplesFallBackToTheServer() throws Exception {
        Classification c = client(logits(1, 1.2f), answering(2)).classify(new float[784]);
        assertEquals(Classification.Source.SERVER, c.source());
        assertEquals(7, c.predictedClass()); // slot 2 holds class "7"
        assertEquals(0.8, c.confidence());
        assertEquals(1, c.local().topOutput());
        assertEquals(0, c.localClass()); // exit output 1 is class "0"
        assertEquals(1, serverCalls.get());
        assertEquals(1_000_000, c.serverLatencyNanos());
        assertEquals(1, tableFetches.get());
    }

    @Test
    void aSlotWithNoClassOfThisPhoneKeepsTheLocalAnswerAndSaysSo() throws Exception {
        Classification c = client(logits(1, 1.2f), answering(10)).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_SERVER_UNNAMED, c.source());
        assertEquals(0, c.predictedClass()); // the local answer: exit output 1, class "0"
        assertEquals(10, c.server().topSlot());
        assertTrue(c.serverError().contains("slot 10"));
    }

    /** One unit prototype per slot of {@code SLOTS}: slot s points along feature s. */
    private static float[][] unitPrototypes() {
        float[][] prototypes = new float[SLOTS.tokens().size()][64 * 8 * 8];
        for (int s = 0; s < prototypes.length; s++) {
            prototypes[s][s] = 1f;
        }
        return prototypes;
    }

    private Classification slotGated(int featureAlong) throws Exception {
        SlotDecoder decoder = new SlotDecoder(new FederationKey(SECRET), CLASS_NAMES, version -> SLOTS);
        // this phone holds classes "9" and "8": slots 0 and 1 (slot s holds class "9 - s")
        boolean[] own = SlotGatePolicy.ownSlots(decoder.decode(SLOTS), Set.of("9", "8"));
        float[] values = new float[64 * 8 * 8];
        values[featureAlong] = 2f;
        FeatureTensor features = new FeatureTensor(values, new int[] {1, 64, 8, 8});
        InferenceEngine engine = new InferenceEngine() {
            @Override
            public FrontEndOutput run(float[] input) {
                return new FrontEndOutput(logits(0, 0.5f), features); // a flat softmax: max-softmax would fall back
            }

            @Override
            public void close() {}
        };
        FallbackServer server = sent -> {
            serverCalls.incrementAndGet();
            return new ServerPrediction("v1", new float[11], 2, 0.8);
        };
        return new HarmonyClient(engine, new SlotGatePolicy(unitPrototypes(), own, 0.5), exits(), server, decoder)
                .classify(new float[784]);
    }

    @Test
    void aSlotGatedPhoneAnswersWhatSitsNearItsOwnSlotsAndSendsTheRest() throws Exception {
        Classification near = slotGated(1); // along slot 1 (own): margin 1 - 0
        assertEquals(Classification.Source.LOCAL_EXIT, near.source());
        assertEquals(1.0, near.confidence(), 1e-12);
        assertEquals(0, serverCalls.get());
        Classification far = slotGated(5); // along slot 5 (another phone's): margin 0 - 1
        assertEquals(Classification.Source.SERVER, far.source());
        assertEquals(-1.0, far.local().confidence(), 1e-12);
        assertEquals(1, serverCalls.get());
    }

    @Test
    void aFallbackServerNeedsASlotDecoder() {
        assertThrows(IllegalArgumentException.class,
                () -> new HarmonyClient(new FixedEngine(new float[] {1f}), new ExitPolicy(0.9), exits(), answering(0), null));
        assertThrows(IllegalArgumentException.class,
                () -> new HarmonyClient(new FixedEngine(new float[] {1f}), new ExitPolicy(0.9), null, null, null));
    }

    @Test
    void theLocalAnswerIsTheClassOfTheTopExitOutputNotItsIndex() throws Exception {
        int moved = 0;
        for (int j = 0; j < CLASS_NAMES.size(); j++) {
            Classification confident = client(logits(j, 9f), null).classify(new float[784]);
            assertEquals(Classification.Source.LOCAL_EXIT, confident.source());
            assertEquals(j, confident.local().topOutput());
            assertEquals(exitClass(j), confident.predictedClass(), "exit output " + j);
            assertEquals(exitClass(j), confident.localClass(), "exit output " + j);

            Classification unsure = client(logits(j, 1.2f), null).classify(new float[784]);
            assertEquals(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, unsure.source());
            assertEquals(exitClass(j), unsure.predictedClass(), "exit output " + j);
            moved += exitClass(j) != j ? 1 : 0;
        }
        assertTrue(moved >= 8, "the vector's token order moves most outputs away from their class index");
    }

    @Test
    void nonFiniteLogitsNameNoClass() throws Exception {
        float[] broken = logits(3, 5f);
        broken[7] = Float.NaN;
        Classification c = client(broken, null).classify(new float[784]);
        assertEquals(-1, c.local().topOutput());
        assertEquals(-1, c.localClass());
        assertEquals(-1, c.predictedClass());
    }

    @Test
    void anExitHeadWithAnotherNumberOfOutputsIsRefused() {
        InferenceException error = assertThrows(InferenceException.class,
                () -> client(new float[] {9f, 0f, 0f}, null).classify(new float[784]));
        assertTrue(error.getMessage().contains("3 logits"), error.getMessage());
    }

    @Test
    void serverFailuresStillGetTheLocalAnswer() throws Exception {
        FallbackServer busy = features -> {
            throw new ServerException(503, "inference queue full", java.time.Duration.ofSeconds(1));
        };
        Classification c = client(logits(1, 1.2f), busy).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, c.source());
        assertEquals(0, c.predictedClass());
        assertTrue(c.serverError().contains("503"));

        FallbackServer offline = features -> {
            throw new IOException("connection refused");
        };
        assertEquals(0, client(logits(1, 1.2f), offline).classify(new float[784]).predictedClass());

        Classification noServer = client(logits(1, 1.2f), null).classify(new float[784]);
        assertEquals(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, noServer.source());
        assertEquals("no fallback server configured", noServer.serverError());
    }
}
