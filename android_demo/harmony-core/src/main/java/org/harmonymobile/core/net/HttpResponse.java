package org.harmonymobile.core.net;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;

/** A complete HTTP response; header names are lower-cased. */
public record HttpResponse(int status, Map<String, List<String>> headers, byte[] body) {
    public HttpResponse {
        headers = headers.entrySet().stream()
                .filter(e -> e.getKey() != null)
                .collect(Collectors.toUnmodifiableMap(
                        e -> e.getKey().toLowerCase(Locale.ROOT), e -> List.copyOf(e.getValue()), (a, b) -> a));
    }

    public boolean isSuccess() {
        return status >= 200 && status < 300;
    }

    /** The first value of a header, or null. */
    public String header(String name) {
        List<String> values = headers.get(name.toLowerCase(Locale.ROOT));
        return values == null || values.isEmpty() ? null : values.get(0);
    }

    public String bodyText() {
        return new String(body, StandardCharsets.UTF_8);
    }

    public JsonObject json() {
        return Json.parseObject(bodyText());
    }
}
