package org.harmonymobile.core.exit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;

class ExitDecisionVectorTest {
    @Test
    void decisionsEqualPython() {
        List<JsonObject> cases = Vectors.load("exit_decisions.json").getObjectList("cases");
        assertTrue(cases.size() >= 10);
        for (JsonObject c : cases) {
            float[] logits = Vectors.floats(c, "logits");
            ExitDecision decision = new ExitPolicy(c.getDouble("threshold")).decide(logits);
            String name = "logits " + c.get("logits") + " threshold " + c.getDouble("threshold");
            assertEquals(c.getInt("predicted_class"), decision.topOutput(), name);
            assertEquals(c.getDouble("confidence"), decision.confidence(), 1e-12, name);
            assertEquals(c.getBoolean("exit_locally"), decision.exitLocally(), name);
        }
    }

    @Test
    void nonFiniteLogitsNeverExit() {
        ExitPolicy policy = new ExitPolicy(0.5);
        assertFalse(policy.decide(new float[] {Float.NaN, 1f}).exitLocally());
        assertFalse(policy.decide(new float[] {Float.POSITIVE_INFINITY, 1f}).exitLocally());
        assertEquals(-1, policy.decide(new float[] {Float.NEGATIVE_INFINITY, 1f}).topOutput());
    }

    @Test
    void extremeLogitsStayFinite() {
        ExitDecision d = new ExitPolicy(0.99).decide(new float[] {Float.MAX_VALUE, -Float.MAX_VALUE, 0f});
        assertEquals(0, d.topOutput());
        assertEquals(1.0, d.confidence());
        assertTrue(d.exitLocally());
    }

    @Test
    void thresholdMustBeAProbability() {
        assertThrows(IllegalArgumentException.class, () -> new ExitPolicy(0));
        assertThrows(IllegalArgumentException.class, () -> new ExitPolicy(1.01));
        assertThrows(IllegalArgumentException.class, () -> new ExitPolicy(Double.NaN));
        assertThrows(IllegalArgumentException.class, () -> new ExitPolicy(0.5).decide(new float[0]));
    }
}
