package org.harmonymobile.core.json;

import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.harmonymobile.core.util.Hex;

/** Typed, fail-loudly access to a parsed JSON object; errors name the missing or mistyped key. */
public final class JsonObject {
    private final Map<String, Object> map;

    public JsonObject(Map<String, Object> map) {
        this.map = map;
    }

    public Map<String, Object> asMap() {
        return map;
    }

    public boolean has(String key) {
        return map.containsKey(key) && map.get(key) != null;
    }

    public Object get(String key) {
        if (!map.containsKey(key)) {
            throw new JsonException("missing key \"" + key + "\"");
        }
        return map.get(key);
    }

    public String getString(String key) {
        return as(key, String.class, "a string");
    }

    public String optString(String key, String fallback) {
        return has(key) ? getString(key) : fallback;
    }

    public long getLong(String key) {
        Object value = get(key);
        if (value instanceof Long l) {
            return l;
        }
        if (value instanceof Double d && d == Math.rint(d) && Math.abs(d) < 0x1p53) {
            return d.longValue();
        }
        throw wrongType(key, "an integer", value);
    }

    public int getInt(String key) {
        long value = getLong(key);
        if (value < Integer.MIN_VALUE || value > Integer.MAX_VALUE) {
            throw new JsonException("\"" + key + "\" is out of int range: " + value);
        }
        return (int) value;
    }

    public double getDouble(String key) {
        return as(key, Number.class, "a number").doubleValue();
    }

    public boolean getBoolean(String key) {
        return as(key, Boolean.class, "true or false");
    }

    public JsonObject getObject(String key) {
        return new JsonObject(Json.asStringMap(as(key, Map.class, "an object")));
    }

    public JsonObject optObject(String key) {
        return has(key) ? getObject(key) : null;
    }

    @SuppressWarnings("unchecked")
    public List<Object> getArray(String key) {
        return as(key, List.class, "an array");
    }

    public List<String> getStringList(String key) {
        List<String> out = new ArrayList<>();
        for (Object item : getArray(key)) {
            if (!(item instanceof String s)) {
                throw wrongType(key, "an array of strings", item);
            }
            out.add(s);
        }
        return out;
    }

    public List<JsonObject> getObjectList(String key) {
        List<JsonObject> out = new ArrayList<>();
        for (Object item : getArray(key)) {
            if (!(item instanceof Map)) {
                throw wrongType(key, "an array of objects", item);
            }
            out.add(new JsonObject(Json.asStringMap(item)));
        }
        return out;
    }

    public long[] getLongArray(String key) {
        List<Object> items = getArray(key);
        long[] out = new long[items.size()];
        for (int i = 0; i < out.length; i++) {
            if (!(items.get(i) instanceof Long l)) {
                throw wrongType(key, "an array of integers", items.get(i));
            }
            out[i] = l;
        }
        return out;
    }

    public double[] getDoubleArray(String key) {
        List<Object> items = getArray(key);
        double[] out = new double[items.size()];
        for (int i = 0; i < out.length; i++) {
            if (!(items.get(i) instanceof Number n)) {
                throw wrongType(key, "an array of numbers", items.get(i));
            }
            out[i] = n.doubleValue();
        }
        return out;
    }

    /** Decodes a standard base64 (RFC 4648) string value. */
    public byte[] getBase64(String key) {
        try {
            return Base64.getDecoder().decode(getString(key));
        } catch (IllegalArgumentException e) {
            throw new JsonException("\"" + key + "\" is not valid base64: " + e.getMessage());
        }
    }

    /** Decodes a lower- or upper-case hex string value. */
    public byte[] getHex(String key) {
        try {
            return Hex.decode(getString(key));
        } catch (IllegalArgumentException e) {
            throw new JsonException("\"" + key + "\" is not valid hex: " + e.getMessage());
        }
    }

    private <T> T as(String key, Class<T> type, String description) {
        Object value = get(key);
        if (!type.isInstance(value)) {
            throw wrongType(key, description, value);
        }
        return type.cast(value);
    }

    private static JsonException wrongType(String key, String expected, Object value) {
        String actual = value == null ? "null" : value.getClass().getSimpleName();
        return new JsonException("\"" + key + "\" must be " + expected + ", got " + actual);
    }

    @Override
    public String toString() {
        return Json.write(map);
    }
}
