package org.harmonymobile.core.net;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.time.Clock;
import java.time.Duration;
import java.util.Optional;
import java.util.Set;

/**
 * Retries network failures and the statuses that say "try again": 429, 502, 503, 504.
 *
 * <p>Every request this project sends is safe to repeat: inference has no side effect and uploads
 * carry a message id the server is idempotent on. Other 4xx/5xx are returned at once (a 400 will
 * not get better). After the last attempt the last response is returned, or the last IOException
 * thrown.
 */
public final class RetryingTransport implements HttpTransport {
    static final Set<Integer> RETRYABLE_STATUSES = Set.of(429, 502, 503, 504);

    private final HttpTransport delegate;
    private final RetryPolicy policy;
    private final Sleeper sleeper;
    private final Clock clock;

    public RetryingTransport(HttpTransport delegate, RetryPolicy policy, Sleeper sleeper, Clock clock) {
        this.delegate = delegate;
        this.policy = policy;
        this.sleeper = sleeper;
        this.clock = clock;
    }

    public RetryingTransport(HttpTransport delegate, RetryPolicy policy) {
        this(delegate, policy, Sleeper.SYSTEM, Clock.systemUTC());
    }

    public static boolean isRetryable(int status) {
        return RETRYABLE_STATUSES.contains(status);
    }

    @Override
    public HttpResponse execute(HttpRequest request) throws IOException {
        for (int attempt = 1; ; attempt++) {
            boolean last = attempt >= policy.maxAttempts();
            Duration wait;
            try {
                HttpResponse response = delegate.execute(request);
                if (!isRetryable(response.status()) || last) {
                    return response;
                }
                Optional<Duration> retryAfter = RetryAfter.parse(response.header("Retry-After"), clock);
                if (retryAfter.isPresent() && retryAfter.get().compareTo(policy.maxRetryAfter()) > 0) {
                    return response; // a long pause was asked for: the caller keeps its local answer
                }
                int retry = attempt - 1;
                wait = retryAfter.orElseGet(() -> policy.backoff(retry));
            } catch (IOException failure) {
                if (last) {
                    throw failure;
                }
                wait = policy.backoff(attempt - 1);
            }
            pause(wait);
        }
    }

    private void pause(Duration wait) throws IOException {
        try {
            sleeper.sleep(wait);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while backing off");
        }
    }
}
