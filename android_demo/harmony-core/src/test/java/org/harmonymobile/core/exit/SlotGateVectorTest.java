package org.harmonymobile.core.exit;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import java.util.List;
import java.util.Set;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;

class SlotGateVectorTest {
    private static float[][] prototypes(JsonObject c) {
        List<Object> rows = c.getArray("prototypes");
        float[][] out = new float[rows.size()][];
        for (int s = 0; s < out.length; s++) {
            List<?> row = (List<?>) rows.get(s);
            out[s] = new float[row.size()];
            for (int i = 0; i < row.size(); i++) {
                out[s][i] = ((Number) row.get(i)).floatValue();
            }
        }
        return out;
    }

    private static boolean[] ownSlots(JsonObject c) {
        List<Object> flags = c.getArray("own_slots");
        boolean[] out = new boolean[flags.size()];
        for (int s = 0; s < out.length; s++) {
            out[s] = (Boolean) flags.get(s);
        }
        return out;
    }

    @Test
    void decisionsEqualPython() {
        List<JsonObject> cases = Vectors.load("slot_gate_decisions.json").getObjectList("cases");
        assertTrue(cases.size() >= 10);
        int exits = 0;
        for (JsonObject c : cases) {
            SlotGatePolicy policy = new SlotGatePolicy(prototypes(c), ownSlots(c), c.getDouble("threshold"));
            ExitDecision decision = policy.decide(Vectors.floats(c, "logits"), Vectors.floats(c, "features"));
            String name = "features " + c.get("features") + " threshold " + c.getDouble("threshold");
            assertEquals(c.getInt("top_output"), decision.topOutput(), name);
            assertEquals(c.getDouble("margin"), decision.confidence(), 1e-12, name);
            assertEquals(c.getBoolean("exit_locally"), decision.exitLocally(), name);
            exits += decision.exitLocally() ? 1 : 0;
        }
        assertTrue(exits > 0 && exits < cases.size(), "the cases exit and fall back");
    }

    @Test
    void ownSlotsAreTheSlotsOfThePhonesClasses() {
        List<String> slotClasses = Arrays.asList("cat", null, "dog", "bird");
        assertArrayEquals(
                new boolean[] {true, false, false, true}, SlotGatePolicy.ownSlots(slotClasses, Set.of("bird", "cat")));
    }

    @Test
    void nonFiniteInputsNeverExit() {
        SlotGatePolicy policy = new SlotGatePolicy(new float[][] {{1f, 0f}, {0f, 1f}}, new boolean[] {true, false}, -2);
        ExitDecision broken = policy.decide(new float[] {1f, 0f}, new float[] {Float.NaN, 1f});
        assertFalse(broken.exitLocally());
        assertEquals(0, broken.topOutput()); // the exit head's answer is still named
        assertTrue(Double.isNaN(broken.confidence()));
        assertFalse(policy.decide(new float[] {Float.NaN, 0f}, new float[] {1f, 0f}).exitLocally());
        assertTrue(policy.decide(new float[] {1f, 0f}, new float[] {1f, 0f}).exitLocally());
    }

    @Test
    void malformedGatesAreRefused() {
        boolean[] one = {true};
        assertThrows(IllegalArgumentException.class, () -> new SlotGatePolicy(new float[][] {{1f}}, new boolean[2], 0));
        assertThrows(IllegalArgumentException.class, () -> new SlotGatePolicy(new float[][] {{1f}}, one, Double.NaN));
        assertThrows(IllegalArgumentException.class, () -> new SlotGatePolicy(new float[][] {{Float.NaN}}, one, 0));
        assertThrows(
                IllegalArgumentException.class, () -> new SlotGatePolicy(new float[][] {{1f}, {1f, 0f}}, new boolean[2], 0));
        SlotGatePolicy policy = new SlotGatePolicy(new float[][] {{1f, 0f}}, one, 0);
        assertThrows(IllegalArgumentException.class, () -> policy.margin(new float[3]));
    }
}
