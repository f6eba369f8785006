package org.harmonymobile.core.net;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Retry and backoff against a real in-JVM HTTP server (com.sun.net.httpserver) on loopback. */
class RetryingTransportTest {
    private HttpServer server;
    private final ConcurrentLinkedQueue<Scripted> script = new ConcurrentLinkedQueue<>();
    private final AtomicInteger requests = new AtomicInteger();
    private final List<String> bodies = Collections.synchronizedList(new ArrayList<>());
    private final List<Duration> sleeps = new ArrayList<>();

    private record Scripted(int status, String retryAfter, String body, long delayMs) {}

    @BeforeEach
    void start() throws IOException {
        server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        server.createContext("/", exchange -> {
            requests.incrementAndGet();
            bodies.add(new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8));
            Scripted next = script.poll();
            if (next == null) {
                next = new Scripted(200, null, "{\"ok\":true}", 0);
            }
            if (next.delayMs() > 0) {
                try {
                    Thread.sleep(next.delayMs());
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            if (next.retryAfter() != null) {
                exchange.getResponseHeaders().add("Retry-After", next.retryAfter());
            }
            byte[] body = next.body().getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(next.status(), body.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(body);
            } catch (IOException clientGone) {
                // the client timed out first
            }
        });
        server.start();
    }

    @AfterEach
    void stop() {
        server.stop(0);
    }

    private String baseUrl() {
        return "http://127.0.0.1:" + server.getAddress().getPort();
    }

    private RetryingTransport transport(int attempts, Duration readTimeout) {
        RetryPolicy policy = new RetryPolicy(attempts, Duration.ofMillis(100), 2.0, Duration.ofMillis(1000),
                Duration.ofSeconds(30), new Random(7));
        return new RetryingTransport(new UrlConnectionTransport(baseUrl(), Duration.ofSeconds(2), readTimeout), policy,
                sleeps::add, Clock.systemUTC());
    }

    private static HttpRequest post(String body) {
        return HttpRequest.post("/v1/uploads", Map.of(), "application/json", body.getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void serviceUnavailableThenSuccessIsRetriedWithTheSameBody() throws Exception {
        script.add(new Scripted(503, null, "{\"detail\":\"queue full\"}", 0));
        script.add(new Scripted(201, null, "{\"upload_id\":1}", 0));
        HttpResponse response = transport(4, Duration.ofSeconds(2)).execute(post("{\"message_id\":\"m1\"}"));
        assertEquals(201, response.status());
        assertEquals(1, response.json().getLong("upload_id"));
        assertEquals(2, requests.get());
        assertEquals(List.of("{\"message_id\":\"m1\"}", "{\"message_id\":\"m1\"}"), bodies);
        assertEquals(1, sleeps.size());
        assertTrue(sleeps.get(0).toMillis() >= 50 && sleeps.get(0).toMillis() <= 100, "backoff " + sleeps);
    }

    @Test
    void retryAfterSecondsIsHonoured() throws Exception {
        script.add(new Scripted(429, "2", "{\"detail\":\"slow down\"}", 0));
        script.add(new Scripted(503, "0", "{}", 0));
        assertEquals(200, transport(4, Duration.ofSeconds(2)).execute(post("x")).status());
        assertEquals(List.of(Duration.ofSeconds(2), Duration.ZERO), sleeps);
    }

    @Test
    void retryAfterHttpDateIsHonoured() {
        Clock clock = Clock.fixed(Instant.parse("2026-11-29T12:00:00Z"), ZoneOffset.UTC);
        String date = DateTimeFormatter.RFC_1123_DATE_TIME.format(Instant.parse("2026-11-29T12:00:05Z").atOffset(ZoneOffset.UTC));
        assertEquals(Duration.ofSeconds(5), RetryAfter.parse(date, clock).orElseThrow());
        assertEquals(Duration.ZERO, RetryAfter.parse("Sun, 29 Nov 2026 11:00:00 GMT", clock).orElseThrow());
        assertTrue(RetryAfter.parse("soon", clock).isEmpty());
        assertTrue(RetryAfter.parse("-3", clock).isEmpty());
        assertTrue(RetryAfter.parse(null, clock).isEmpty());
    }

    @Test
    void aLongRetryAfterGivesUpAtOnceSoThePhoneKeepsItsAnswer() throws Exception {
        script.add(new Scripted(503, "3600", "{\"detail\":\"busy\"}", 0));
        HttpResponse response = transport(4, Duration.ofSeconds(2)).execute(post("x"));
        assertEquals(503, response.status());
        assertEquals(1, requests.get());
        assertTrue(sleeps.isEmpty());
    }

    @Test
    void backoffGrowsExponentiallyUpToTheCapAndTheLastResponseIsReturned() throws Exception {
        for (int i = 0; i < 5; i++) {
            script.add(new Scripted(503, null, "{}", 0));
        }
        HttpResponse response = transport(5, Duration.ofSeconds(2)).execute(post("x"));
        assertEquals(503, response.status());
        assertEquals(5, requests.get());
        assertEquals(4, sleeps.size());
        long[] ceilings = {100, 200, 400, 800};
        for (int i = 0; i < 4; i++) {
            long ms = sleeps.get(i).toMillis();
            assertTrue(ms >= ceilings[i] / 2 && ms <= ceilings[i], "retry " + i + " waited " + ms);
        }
    }

    @Test
    void clientErrorsAreNotRetried() throws Exception {
        script.add(new Scripted(400, null, "{\"detail\":\"bad envelope\"}", 0));
        HttpResponse response = transport(4, Duration.ofSeconds(2)).execute(post("x"));
        assertEquals(400, response.status());
        assertEquals("bad envelope", response.json().getString("detail"));
        assertEquals(1, requests.get());
    }

    @Test
    void readTimeoutsAreRetriedThenSurface() throws Exception {
        script.add(new Scripted(200, null, "{}", 600));
        script.add(new Scripted(200, null, "{}", 600));
        assertThrows(SocketTimeoutException.class, () -> transport(2, Duration.ofMillis(150)).execute(post("x")));
        assertEquals(1, sleeps.size());
    }

    @Test
    void connectionRefusedIsRetriedThenThrown() throws Exception {
        int closedPort;
        try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            closedPort = socket.getLocalPort();
        }
        RetryingTransport transport = new RetryingTransport(
                new UrlConnectionTransport("http://127.0.0.1:" + closedPort, Duration.ofMillis(500), Duration.ofMillis(500)),
                new RetryPolicy(3, Duration.ofMillis(10), 2.0, Duration.ofMillis(40), Duration.ofSeconds(1), new Random(1)),
                sleeps::add, Clock.systemUTC());
        assertThrows(IOException.class, () -> transport.execute(post("x")));
        assertEquals(2, sleeps.size());
    }

    @Test
    void oversizedResponsesAreRefused() {
        script.add(new Scripted(200, null, "x".repeat(2000), 0));
        UrlConnectionTransport small = new UrlConnectionTransport(baseUrl(), Duration.ofSeconds(1), Duration.ofSeconds(1), 1000);
        assertThrows(IOException.class, () -> small.execute(post("x")));
    }

    @Test
    void policyValidation() {
        assertThrows(IllegalArgumentException.class,
                () -> new RetryPolicy(0, Duration.ZERO, 2, Duration.ZERO, Duration.ZERO, new Random()));
        assertEquals(1, RetryPolicy.noRetry().maxAttempts());
        assertTrue(RetryingTransport.isRetryable(503) && RetryingTransport.isRetryable(429));
        assertTrue(!RetryingTransport.isRetryable(500) && !RetryingTransport.isRetryable(409));
    }
}
