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
 * with the local guess anyway. The server answers with a slot; {@link SlotDecoder} maps it to a class, and
 * a slot that names none of this phone's classes also leaves the local answer standing. A
 * classification therefore always has an answer.
 */
public final class HarmonyClient {
    private final InferenceEngine engine;
    private final ExitPolicy exitPolicy;
    private final FallbackServer fallback;
    private final SlotDecoder slots;
    private final LongSupplier nanoTime;

    /**
     * @param fallback the server, or null for local-only operation (offline, or crypto unavailable)
     * @param slots maps the server's slots to this phone's classes; required with a fallback server
     */
    public HarmonyClient(InferenceEngine engine, ExitPolicy exitPolicy, FallbackServer fallback, SlotDecoder slots,
            LongSupplier nanoTime) {
        if (fallback != null && slots == null) {
            throw new IllegalArgumentException("a fallback server answers in slots: pass a SlotDecoder");
        }
        this.engine = engine;
        this.exitPolicy = exitPolicy;
        this.fallback = fallback;
        this.slots = slots;
        this.nanoTime = nanoTime;
    }

    public HarmonyClient(InferenceEngine engine, ExitPolicy exitPolicy, FallbackServer fallback, SlotDecoder slots) {
        this(engine, exitPolicy, fallback, slots, System::nanoTime);
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
            int serverClass = slots.classIndex(server);
            long serverNanos = nanoTime.getAsLong() - serverStart;
            if (serverClass < 0) {
                String reason = "the server's slot " + server.topSlot() + " (version " + server.modelVersion()
                        + ") names none of this phone's classes";
                return new Classification(Classification.Source.LOCAL_SERVER_UNNAMED, local.predictedClass(),
                        local.confidence(), local, server, reason, localNanos, serverNanos, output.features());
            }
            return new Classification(Classification.Source.SERVER, serverClass, server.confidence(), local, server,
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
