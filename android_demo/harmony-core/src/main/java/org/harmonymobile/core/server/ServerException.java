package org.harmonymobile.core.server;

import java.time.Duration;
import java.util.Optional;

/** The server answered with an error status; {@code detail} is its one-sentence explanation. */
public final class ServerException extends Exception {
    private final int status;
    private final String detail;
    private final Duration retryAfter;

    public ServerException(int status, String detail, Duration retryAfter) {
        super("server answered " + status + ": " + detail);
        this.status = status;
        this.detail = detail;
        this.retryAfter = retryAfter;
    }

    public int status() {
        return status;
    }

    public String detail() {
        return detail;
    }

    public Optional<Duration> retryAfter() {
        return Optional.ofNullable(retryAfter);
    }

    /** 429 / 502 / 503 / 504: the same request may succeed later. */
    public boolean isTransient() {
        return status == 429 || status == 502 || status == 503 || status == 504;
    }
}
