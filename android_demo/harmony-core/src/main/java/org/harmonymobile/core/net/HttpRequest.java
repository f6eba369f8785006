package org.harmonymobile.core.net;

import java.util.LinkedHashMap;
import java.util.Map;
import org.harmonymobile.core.util.Immutable;

/** An HTTP request relative to the server's base URL; the body may be null (GET). */
public record HttpRequest(String method, String path, Map<String, String> headers, byte[] body) {
    public HttpRequest {
        headers = Immutable.map(headers);
    }

    public static HttpRequest get(String path, Map<String, String> headers) {
        return new HttpRequest("GET", path, headers, null);
    }

    public static HttpRequest post(String path, Map<String, String> headers, String contentType, byte[] body) {
        Map<String, String> all = new LinkedHashMap<>(headers);
        all.put("Content-Type", contentType);
        return new HttpRequest("POST", path, all, body);
    }
}
