package org.harmonymobile.core.net;

import java.time.Clock;
import java.time.Duration;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.Optional;

/** Parses an HTTP Retry-After header (RFC 9110 10.2.3): delay-seconds or an HTTP-date. */
public final class RetryAfter {
    private RetryAfter() {}

    public static Optional<Duration> parse(String value, Clock clock) {
        if (value == null || value.trim().isEmpty()) {
            return Optional.empty();
        }
        String trimmed = value.trim();
        try {
            long seconds = Long.parseLong(trimmed);
            return seconds < 0 ? Optional.empty() : Optional.of(Duration.ofSeconds(seconds));
        } catch (NumberFormatException notSeconds) {
            try {
                ZonedDateTime when = ZonedDateTime.parse(trimmed, DateTimeFormatter.RFC_1123_DATE_TIME);
                Duration wait = Duration.between(clock.instant(), when.toInstant());
                return Optional.of(wait.isNegative() ? Duration.ZERO : wait);
            } catch (DateTimeParseException notDate) {
                return Optional.empty();
            }
        }
    }
}
