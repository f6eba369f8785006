package org.harmonymobile.core.net;

import java.time.Duration;
import java.util.Random;

/**
 * Exponential backoff with "equal jitter": attempt n (0-based) waits
 * {@code d = min(maxDelay, initialDelay * multiplier^n)}, drawn uniformly from [d/2, d].
 * A server's Retry-After replaces the computed delay; if it asks for longer than
 * {@code maxRetryAfter} the client gives up instead (the phone keeps its local answer and the
 * upload queue tries again later).
 */
public final class RetryPolicy {
    private final int maxAttempts;
    private final Duration initialDelay;
    private final double multiplier;
    private final Duration maxDelay;
    private final Duration maxRetryAfter;
    private final Random random;

    public RetryPolicy(
            int maxAttempts, Duration initialDelay, double multiplier, Duration maxDelay, Duration maxRetryAfter,
            Random random) {
        if (maxAttempts < 1 || multiplier < 1 || initialDelay.isNegative() || maxDelay.compareTo(initialDelay) < 0) {
            throw new IllegalArgumentException("invalid retry policy");
        }
        this.maxAttempts = maxAttempts;
        this.initialDelay = initialDelay;
        this.multiplier = multiplier;
        this.maxDelay = maxDelay;
        this.maxRetryAfter = maxRetryAfter;
        this.random = random;
    }

    /** 4 attempts, 250 ms doubling up to 4 s, Retry-After honoured up to 30 s. */
    public static RetryPolicy defaults() {
        return new RetryPolicy(4, Duration.ofMillis(250), 2.0, Duration.ofSeconds(4), Duration.ofSeconds(30), new Random());
    }

    public static RetryPolicy noRetry() {
        return new RetryPolicy(1, Duration.ZERO, 1.0, Duration.ZERO, Duration.ZERO, new Random());
    }

    public int maxAttempts() {
        return maxAttempts;
    }

    public Duration maxRetryAfter() {
        return maxRetryAfter;
    }

    /** The wait before retry number {@code retry} (0 = the first retry). */
    public Duration backoff(int retry) {
        double ceiling = Math.min(maxDelay.toMillis(), initialDelay.toMillis() * Math.pow(multiplier, retry));
        long half = (long) (ceiling / 2);
        long jitter = (long) Math.ceil(ceiling) - half;
        return Duration.ofMillis(half + (jitter > 0 ? (long) (random.nextDouble() * (jitter + 1)) : 0));
    }
}
