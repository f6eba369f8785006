package org.harmonymobile.core.json;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

class JsonTest {
    @Test
    void parsesEveryValueKind() {
        JsonObject o = Json.parseObject(
                " {\"s\": \"x\", \"i\": -12, \"d\": 2.5e-3, \"t\": true, \"f\": false, \"n\": null, \"a\": [1, [2]], \"o\": {}} ");
        assertEquals("x", o.getString("s"));
        assertEquals(-12L, o.getLong("i"));
        assertEquals(0.0025, o.getDouble("d"));
        assertTrue(o.getBoolean("t"));
        assertEquals(false, o.getBoolean("f"));
        assertNull(o.get("n"));
        assertEquals(List.of(1L, List.of(2L)), o.getArray("a"));
        assertTrue(o.getObject("o").asMap().isEmpty());
    }

    @Test
    void keepsKeyOrder() {
        JsonObject o = Json.parseObject("{\"b\":1,\"a\":2,\"c\":3}");
        assertEquals(List.of("b", "a", "c"), List.copyOf(o.asMap().keySet()));
    }

    @Test
    void decodesEscapesAndSurrogatePairs() {
        Object value = Json.parse("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00 raw é😀\"");
        assertEquals("a\"b\\c/d\b\f\n\r\té😀 raw é😀", value);
    }

    @Test
    void numbers() {
        assertEquals(0L, Json.parse("0"));
        assertEquals(-0.0, Json.parse("-0.0"));
        assertEquals(Long.MAX_VALUE, Json.parse("9223372036854775807"));
        assertEquals(9.223372036854775808E18, Json.parse("9223372036854775808")); // beyond long: a double
        assertEquals(1e300, Json.parse("1E+300"));
        assertEquals(3.4028234663852886e38, Json.parse("3.4028234663852886e+38"));
        assertEquals(1.401298464324817e-45, Json.parse("1.401298464324817e-45"));
    }

    @ParameterizedTest
    @ValueSource(strings = {
        "", " ", "{", "[1,]", "[1 2]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "-", "1.", ".5", "1e", "+1",
        "NaN", "Infinity", "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00x\"",
        "\"tab\there\"", "[1] 2", "{\"a\":1}}", "1e400", "{\"a\":1,\"a\":2}", "'single'"
    })
    void rejectsMalformedText(String text) {
        assertThrows(JsonException.class, () -> Json.parse(text));
    }

    @Test
    void rejectsNestingDeeperThanTheLimit() {
        String deep = "[".repeat(Json.MAX_DEPTH + 2) + "]".repeat(Json.MAX_DEPTH + 2);
        assertThrows(JsonException.class, () -> Json.parse(deep));
        String ok = "[".repeat(Json.MAX_DEPTH) + "]".repeat(Json.MAX_DEPTH);
        Json.parse(ok);
    }

    @Test
    void typedAccessNamesTheKey() {
        JsonObject o = Json.parseObject("{\"a\": \"text\", \"big\": 3000000000, \"f\": 1.5}");
        JsonException missing = assertThrows(JsonException.class, () -> o.getString("zzz"));
        assertTrue(missing.getMessage().contains("zzz"));
        JsonException wrong = assertThrows(JsonException.class, () -> o.getLong("a"));
        assertTrue(wrong.getMessage().contains("\"a\""));
        assertThrows(JsonException.class, () -> o.getInt("big"));
        assertThrows(JsonException.class, () -> o.getLong("f"));
        assertThrows(JsonException.class, () -> Json.parseObject("[1]"));
    }

    @Test
    void base64AndHexAccessors() {
        JsonObject o = Json.parseObject("{\"b\": \"AAEC/w==\", \"h\": \"0001ff\", \"bad\": \"*\"}");
        assertEquals("[0, 1, 2, -1]", Arrays.toString(o.getBase64("b")));
        assertEquals("[0, 1, -1]", Arrays.toString(o.getHex("h")));
        assertThrows(JsonException.class, () -> o.getBase64("bad"));
        assertThrows(JsonException.class, () -> o.getHex("bad"));
    }

    @Test
    void writesCompactJsonThatParsesBack() {
        Map<String, Object> value = new LinkedHashMap<>();
        value.put("text", "quote\" backslash\\ newline\n control\u0001 é");
        value.put("int", 42);
        value.put("long", Long.MIN_VALUE);
        value.put("double", 0.5);
        value.put("list", List.of(true, false));
        value.put("null", null);
        value.put("floats", new float[] {1.5f, -2f});
        String text = Json.write(value);
        assertEquals("{\"text\":\"quote\\\" backslash\\\\ newline\\n control\\u0001 é\",\"int\":42,"
                + "\"long\":-9223372036854775808,\"double\":0.5,\"list\":[true,false],\"null\":null,"
                + "\"floats\":[1.5,-2.0]}", text);
        JsonObject back = Json.parseObject(text);
        assertEquals(value.get("text"), back.getString("text"));
        assertEquals(Long.MIN_VALUE, back.getLong("long"));
    }

    @Test
    void writesDoublesInThePythonReferencesForm() {
        // pydantic-core's layout (the upload metadata bytes of feature_encoding.json), not Java's 1.0E-7
        assertEquals("1e-7", Json.number(1e-7));
        assertEquals("1.5e+20", Json.number(1.5e20));
        assertEquals("9.99e-6", Json.number(9.99e-6));
        assertEquals("0.00001", Json.number(1e-5));
        assertEquals("1000000000000000.0", Json.number(1e15));
        assertEquals("1e+16", Json.number(1e16));
        assertEquals("-0.0", Json.number(-0.0));
        assertEquals("0.1", Json.number(0.1));
        assertEquals("12345678.5", Json.number(12345678.5));
        assertEquals("1.7976931348623157e+308", Json.number(Double.MAX_VALUE));
        assertEquals("5e-324", Json.number(Double.MIN_VALUE));
    }

    @Test
    void refusesToWriteWhatJsonCannotHold() {
        assertThrows(JsonException.class, () -> Json.write(Double.NaN));
        assertThrows(JsonException.class, () -> Json.write(Map.of(1, 2)));
        assertThrows(JsonException.class, () -> Json.write(new Object()));
    }

    @Test
    void parsedContainersAreImmutable() {
        Object list = Json.parse("[1]");
        assertThrows(UnsupportedOperationException.class, () -> ((List<Object>) list).add(2L));
    }
}
