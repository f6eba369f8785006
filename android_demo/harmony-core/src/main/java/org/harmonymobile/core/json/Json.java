package org.harmonymobile.core.json;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small, strict JSON (RFC 8259) reader and writer with no dependencies.
 *
 * <p>Values map to Java as: object -> {@code Map<String, Object>} (insertion ordered, unmodifiable),
 * array -> {@code List<Object>} (unmodifiable), string -> {@link String}, number -> {@link Long}
 * when written without fraction or exponent and in range, otherwise {@link Double}, true/false ->
 * {@link Boolean}, null -> {@code null}. Use {@link JsonObject} for typed access.
 *
 * <p>Strict on purpose, because it reads signed manifests and server answers: duplicate object
 * keys, trailing garbage, leading zeros, unescaped control characters, lone surrogates, NaN and
 * nesting deeper than {@value #MAX_DEPTH} are errors.
 */
public final class Json {
    public static final int MAX_DEPTH = 64;

    private Json() {}

    /**
     * A finite double in pydantic-core's form (the Python reference's upload metadata bytes): the
     * shortest digits that read back as the same double; plain notation with at least one fractional
     * digit when the decimal exponent e is in -5..15 ({@code 1.0}, {@code 0.00001},
     * {@code 1000000000000000.0}), otherwise {@code d[.ddd]e+X} / {@code d[.ddd]e-X} with no leading
     * zeros in X ({@code 1e-7}, {@code 1.5e+20}).
     */
    public static String number(double value) {
        if (Double.isNaN(value) || Double.isInfinite(value)) {
            throw new JsonException("JSON cannot represent " + value);
        }
        String sign = (Double.doubleToRawLongBits(value) < 0) ? "-" : "";
        if (value == 0) {
            return sign + "0.0";
        }
        BigDecimal exact = new BigDecimal(Math.abs(value));
        BigDecimal shortest = exact;
        for (int precision = 1; precision <= 17; precision++) {
            BigDecimal rounded =
                    exact.round(new MathContext(precision, RoundingMode.HALF_EVEN));
            if (rounded.doubleValue() == Math.abs(value)) {
                shortest = rounded;
                break;
            }
        }
        shortest = shortest.stripTrailingZeros();
        String digits = shortest.unscaledValue().toString();
        int exponent = digits.length() - 1 - shortest.scale(); // value = d.ddd x 10^exponent
        if (exponent < -5 || exponent > 15) {
            String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
            return sign + mantissa + "e" + (exponent >= 0 ? "+" : "-") + Math.abs(exponent);
        }
        int point = exponent + 1; // digits before the decimal point
        if (point <= 0) {
            return sign + "0." + "0".repeat(-point) + digits;
        }
        if (point >= digits.length()) {
            return sign + digits + "0".repeat(point - digits.length()) + ".0";
        }
        return sign + digits.substring(0, point) + "." + digits.substring(point);
    }

    /** Parses one JSON text. */
    public static Object parse(String text) {
        Reader reader = new Reader(text);
        reader.skipWhitespace();
        Object value = reader.readValue(0);
        reader.skipWhitespace();
        if (!reader.atEnd()) {
            throw reader.error("unexpected data after the JSON value");
        }
        return value;
    }

    /** Parses a JSON text whose top level must be an object. */
    public static JsonObject parseObject(String text) {
        Object value = parse(text);
        if (!(value instanceof Map)) {
            throw new JsonException("expected a JSON object at the top level");
        }
        return new JsonObject(asStringMap(value));
    }

    /** Serializes maps, lists, strings, numbers, booleans, null and {@link JsonObject}s compactly. */
    public static String write(Object value) {
        StringBuilder out = new StringBuilder();
        writeValue(out, value);
        return out.toString();
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> asStringMap(Object value) {
        return (Map<String, Object>) value;
    }

    private static void writeValue(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof String s) {
            writeString(out, s);
        } else if (value instanceof Boolean b) {
            out.append(b.booleanValue());
        } else if (value instanceof Double || value instanceof Float) {
            double d = ((Number) value).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new JsonException("JSON cannot represent " + d);
            }
            out.append(number(d));
        } else if (value instanceof Number n) {
            out.append(n.longValue());
        } else if (value instanceof JsonObject o) {
            writeValue(out, o.asMap());
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                if (!(entry.getKey() instanceof String key)) {
                    throw new JsonException("JSON object keys must be strings, got " + entry.getKey());
                }
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeString(out, key);
                out.append(':');
                writeValue(out, entry.getValue());
            }
            out.append('}');
        } else if (value instanceof Iterable<?> items) {
            out.append('[');
            boolean first = true;
            for (Object item : items) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeValue(out, item);
            }
            out.append(']');
        } else if (value instanceof float[] floats) {
            out.append('[');
            for (int i = 0; i < floats.length; i++) {
                if (i > 0) {
                    out.append(',');
                }
                writeValue(out, (double) floats[i]);
            }
            out.append(']');
        } else {
            throw new JsonException("cannot write a " + value.getClass().getName() + " as JSON");
        }
    }

    private static void writeString(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /** Recursive-descent reader over the whole text. */
    private static final class Reader {
        private final String text;
        private int pos;

        Reader(String text) {
            if (text == null) {
                throw new JsonException("no JSON text (null)");
            }
            this.text = text;
        }

        boolean atEnd() {
            return pos >= text.length();
        }

        JsonException error(String message) {
            return new JsonException(message + " at offset " + pos);
        }

        void skipWhitespace() {
            while (pos < text.length()) {
                char c = text.charAt(pos);
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                    return;
                }
                pos++;
            }
        }

        Object readValue(int depth) {
            if (depth > MAX_DEPTH) {
                throw error("JSON nested deeper than " + MAX_DEPTH + " levels");
            }
            if (atEnd()) {
                throw error("unexpected end of JSON text");
            }
            char c = text.charAt(pos);
            return switch (c) {
                case '{' -> readObject(depth);
                case '[' -> readArray(depth);
                case '"' -> readString();
                case 't' -> readLiteral("true", Boolean.TRUE);
                case 'f' -> readLiteral("false", Boolean.FALSE);
                case 'n' -> readLiteral("null", null);
                default -> {
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        yield readNumber();
                    }
                    throw error("unexpected character '" + c + "'");
                }
            };
        }

        private Object readLiteral(String literal, Object value) {
            if (!text.startsWith(literal, pos)) {
                throw error("invalid literal, expected " + literal);
            }
            pos += literal.length();
            return value;
        }

        private Map<String, Object> readObject(int depth) {
            pos++; // '{'
            Map<String, Object> map = new LinkedHashMap<>();
            skipWhitespace();
            if (peek() == '}') {
                pos++;
                return Collections.unmodifiableMap(map);
            }
            while (true) {
                skipWhitespace();
                if (peek() != '"') {
                    throw error("expected a string key");
                }
                String key = readString();
                skipWhitespace();
                expect(':');
                skipWhitespace();
                Object value = readValue(depth + 1);
                if (map.containsKey(key)) {
                    throw error("duplicate key \"" + key + "\"");
                }
                map.put(key, value);
                skipWhitespace();
                char c = next("',' or '}'");
                if (c == '}') {
                    return Collections.unmodifiableMap(map);
                }
                if (c != ',') {
                    pos--;
                    throw error("expected ',' or '}'");
                }
            }
        }

        private List<Object> readArray(int depth) {
            pos++; // '['
            List<Object> list = new ArrayList<>();
            skipWhitespace();
            if (peek() == ']') {
                pos++;
                return Collections.unmodifiableList(list);
            }
            while (true) {
                skipWhitespace();
                list.add(readValue(depth + 1));
                skipWhitespace();
                char c = next("',' or ']'");
                if (c == ']') {
                    return Collections.unmodifiableList(list);
                }
                if (c != ',') {
                    pos--;
                    throw error("expected ',' or ']'");
                }
            }
        }

        private String readString() {
            pos++; // opening quote
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = next("closing '\"'");
                if (c == '"') {
                    return sb.toString();
                }
                if (c < 0x20) {
                    pos--;
                    throw error("unescaped control character in string");
                }
                if (c == '\\') {
                    readEscape(sb);
                } else if (Character.isHighSurrogate(c)) {
                    char low = pos < text.length() ? text.charAt(pos) : 0;
                    if (!Character.isLowSurrogate(low)) {
                        throw error("unpaired surrogate in string");
                    }
                    pos++;
                    sb.append(c).append(low);
                } else if (Character.isLowSurrogate(c)) {
                    pos--;
                    throw error("unpaired surrogate in string");
                } else {
                    sb.append(c);
                }
            }
        }

        private void readEscape(StringBuilder sb) {
            char e = next("escape character");
            switch (e) {
                case '"' -> sb.append('"');
                case '\\' -> sb.append('\\');
                case '/' -> sb.append('/');
                case 'b' -> sb.append('\b');
                case 'f' -> sb.append('\f');
                case 'n' -> sb.append('\n');
                case 'r' -> sb.append('\r');
                case 't' -> sb.append('\t');
                case 'u' -> {
                    char unit = readHex4();
                    if (Character.isHighSurrogate(unit)) {
                        if (!text.startsWith("\\u", pos)) {
                            throw error("unpaired surrogate escape");
                        }
                        pos += 2;
                        char low = readHex4();
                        if (!Character.isLowSurrogate(low)) {
                            throw error("unpaired surrogate escape");
                        }
                        sb.append(unit).append(low);
                    } else if (Character.isLowSurrogate(unit)) {
                        throw error("unpaired surrogate escape");
                    } else {
                        sb.append(unit);
                    }
                }
                default -> {
                    pos--;
                    throw error("invalid escape '\\" + e + "'");
                }
            }
        }

        private char readHex4() {
            if (pos + 4 > text.length()) {
                throw error("truncated \\u escape");
            }
            int value = 0;
            for (int i = 0; i < 4; i++) {
                int digit = Character.digit(text.charAt(pos + i), 16);
                if (digit < 0) {
                    throw error("invalid hex digit in \\u escape");
                }
                value = value * 16 + digit;
            }
            pos += 4;
            return (char) value;
        }

        private Object readNumber() {
            int start = pos;
            if (peek() == '-') {
                pos++;
            }
            if (peek() == '0') {
                pos++;
                if (isDigit(peek())) {
                    throw error("leading zero in number");
                }
            } else if (isDigit(peek())) {
                skipDigits();
            } else {
                throw error("expected a digit");
            }
            boolean integral = true;
            if (peek() == '.') {
                integral = false;
                pos++;
                if (!isDigit(peek())) {
                    throw error("expected a digit after '.'");
                }
                skipDigits();
            }
            if (peek() == 'e' || peek() == 'E') {
                integral = false;
                pos++;
                if (peek() == '+' || peek() == '-') {
                    pos++;
                }
                if (!isDigit(peek())) {
                    throw error("expected a digit in the exponent");
                }
                skipDigits();
            }
            String literal = text.substring(start, pos);
            if (integral) {
                try {
                    return Long.parseLong(literal);
                } catch (NumberFormatException tooLarge) {
                    // falls through to a double, like JavaScript and most JSON readers
                }
            }
            double value = Double.parseDouble(literal);
            if (Double.isInfinite(value)) {
                throw error("number out of range: " + literal);
            }
            return value;
        }

        private void skipDigits() {
            while (isDigit(peek())) {
                pos++;
            }
        }

        private static boolean isDigit(char c) {
            return c >= '0' && c <= '9';
        }

        private char peek() {
            return pos < text.length() ? text.charAt(pos) : '\0';
        }

        private char next(String expected) {
            if (atEnd()) {
                throw error("unexpected end of JSON text, expected " + expected);
            }
            return text.charAt(pos++);
        }

        private void expect(char c) {
            if (peek() != c) {
                throw error("expected '" + c + "'");
            }
            pos++;
        }
    }
}
