package org.harmonymobile.core;

import java.io.IOException;
import java.util.function.LongSupplier;
import org.harmonymobile.core.engine.FrontEndOutput;
import org.harmonymobile.core.engine.InferenceEngine;
import org.harmonymobile.core.engine.InferenceException;
import org.harmonymobile.core.exit.ExitDecision;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.server.ServerPrediction;

/**
 * The phone side of HARMONY inference: run the front-end; answer locally when the exit head is
 * confident (max softmax >= the tier's threshold), otherwise ask the server back-end with the
 * interface features; if the server fails (network, 4xx/5xx, 503 with a long Retry-After), answer
 * with the local guess anyway. A classification therefore always has an answer.
 */
public final class HarmonyClient {
    private final InferenceEngine engine;
    private final ExitPolicy exitPolicy;
    private final FallbackServer fallback;
    private final LongSupplier nanoTime;

    /**
     * @param fallback the server, or null for local-only operation (offline, or crypto unavailable)
     */
    public HarmonyClient(InferenceEngine engine, ExitPolicy exitPolicy, FallbackServer fallback, LongSupplier nanoTime) {
        this.engine = engine;
        this.exitPolicy = exitPolicy;
        this.fallback = fallback;
        this.nanoTime = nanoTime;
    }

    public HarmonyClient(InferenceEngine engine, ExitPolicy exitPolicy, FallbackServer fallback) {
        this(engine, exitPolicy, fallback, System::nanoTime);
    }

    public Classification classify(float[] input) throws InferenceException {
        long start = nanoTime.getAsLong();
        FrontEndOutput output = engine.run(input);
        ExitDecision local = exitPolicy.decide(output.exitLogits());
        long localNanos = nanoTime.getAsLong() - start;
        if (local.exitLocally()) {
            return new Classification(Classification.Source.LOCAL_EXIT, local.predictedClass(), local.confidence(), local,
                    null, null, localNanos, 0, output.features());
        }
        if (fallback == null) {
            return localAfterFailure(local, "no fallback server configured", localNanos, 0, output);
        }
        long serverStart = nanoTime.getAsLong();
        try {
            ServerPrediction server = fallback.predict(output.features());
            long serverNanos = nanoTime.getAsLong() - serverStart;
            return new Classification(Classification.Source.SERVER, server.topClass(), server.confidence(), local, server,
                    null, localNanos, serverNanos, output.features());
        } catch (IOException | ServerException | RuntimeException failure) {
            long serverNanos = nanoTime.getAsLong() - serverStart;
            return localAfterFailure(local, describe(failure), localNanos, serverNanos, output);
        }
    }

    private static Classification localAfterFailure(
            ExitDecision local, String reason, long localNanos, long serverNanos, FrontEndOutput output) {
        return new Classification(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, local.predictedClass(),
                local.confidence(), local, null, reason, localNanos, serverNanos, output.features());
    }

    private static String describe(Exception failure) {
        String message = failure.getMessage();
        return failure.getClass().getSimpleName() + (message == null ? "" : ": " + message);
    }
}
