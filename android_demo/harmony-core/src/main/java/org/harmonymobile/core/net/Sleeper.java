package org.harmonymobile.core.net;

import java.time.Duration;

/** Waits between retries; tests substitute one that records instead of sleeping. */
@FunctionalInterface
public interface Sleeper {
    void sleep(Duration duration) throws InterruptedException;

    Sleeper SYSTEM = duration -> Thread.sleep(duration.toMillis());
}
