package org.harmonymobile.core.net;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.time.Duration;
import java.util.Map;

/**
 * {@link HttpTransport} on {@link HttpURLConnection}: on Android and on the JVM alike, no dependencies.
 * Responses are capped at {@code maxResponseBytes} so a misbehaving server cannot exhaust the heap.
 */
public final class UrlConnectionTransport implements HttpTransport {
    private final String baseUrl;
    private final int connectTimeoutMs;
    private final int readTimeoutMs;
    private final int maxResponseBytes;

    public UrlConnectionTransport(String baseUrl, Duration connectTimeout, Duration readTimeout) {
        this(baseUrl, connectTimeout, readTimeout, 8 << 20);
    }

    public UrlConnectionTransport(String baseUrl, Duration connectTimeout, Duration readTimeout, int maxResponseBytes) {
        this.baseUrl = baseUrl.endsWith("/") ? baseUrl.substring(0, baseUrl.length() - 1) : baseUrl;
        this.connectTimeoutMs = Math.toIntExact(connectTimeout.toMillis());
        this.readTimeoutMs = Math.toIntExact(readTimeout.toMillis());
        this.maxResponseBytes = maxResponseBytes;
    }

    public String baseUrl() {
        return baseUrl;
    }

    @Override
    public HttpResponse execute(HttpRequest request) throws IOException {
        HttpURLConnection connection = (HttpURLConnection) new URL(baseUrl + request.path()).openConnection();
        try {
            connection.setConnectTimeout(connectTimeoutMs);
            connection.setReadTimeout(readTimeoutMs);
            connection.setInstanceFollowRedirects(false);
            connection.setUseCaches(false);
            connection.setRequestMethod(request.method());
            connection.setRequestProperty("Accept", "application/json");
            for (Map.Entry<String, String> header : request.headers().entrySet()) {
                connection.setRequestProperty(header.getKey(), header.getValue());
            }
            if (request.body() != null) {
                // Not setFixedLengthStreamingMode: in streaming mode the JDK's HttpURLConnection drops the
                // body of a 401 (it cannot "retry" the authentication), and our bodies are in memory anyway.
                connection.setDoOutput(true);
                try (OutputStream out = connection.getOutputStream()) {
                    out.write(request.body());
                }
            }
            int status = connection.getResponseCode();
            InputStream stream = status >= 400 ? connection.getErrorStream() : connection.getInputStream();
            byte[] body = stream == null ? new byte[0] : readCapped(stream);
            return new HttpResponse(status, connection.getHeaderFields(), body);
        } finally {
            connection.disconnect();
        }
    }

    private byte[] readCapped(InputStream stream) throws IOException {
        try (InputStream in = stream) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buffer = new byte[8192];
            for (int n; (n = in.read(buffer)) > 0; ) {
                if (out.size() + n > maxResponseBytes) {
                    throw new IOException("response larger than " + maxResponseBytes + " bytes");
                }
                out.write(buffer, 0, n);
            }
            return out.toByteArray();
        }
    }
}
