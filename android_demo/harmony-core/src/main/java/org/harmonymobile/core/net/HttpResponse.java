package org.harmonymobile.core.net;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.LinkedHashMap;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/** A complete HTTP response; header names are lower-cased. */
public record HttpResponse(int status, Map<String, List<String>> headers, byte[] body) {
    public HttpResponse {
        Map<String, List<String>> lowerCased = new LinkedHashMap<>();
        for (Map.Entry<String, List<String>> header : headers.entrySet()) {
            if (header.getKey() != null) { // HttpURLConnection lists the status line under a null key
                lowerCased.putIfAbsent(header.getKey().toLowerCase(Locale.ROOT), Immutable.list(header.getValue()));
            }
        }
        headers = Immutable.map(lowerCased);
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
