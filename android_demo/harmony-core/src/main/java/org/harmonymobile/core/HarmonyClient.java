package org.harmonymobile.core;

import java.io.IOException;
import java.util.function.LongSupplier;
import org.harmonymobile.core.engine.FrontEndOutput;
import org.harmonymobile.core.engine.InferenceEngine;
import org.harmonymobile.core.engine.InferenceException;
import org.harmonymobile.core.exit.ExitDecision;
import org.harmonymobile.core.exit.ExitGate;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.server.ServerPrediction;

/**
 * The phone side of HARMONY inference: run the front-end; answer locally when the exit head is
 * confident (max softmax >= the tier's threshold), otherwise ask the server back-end with the
 * interface features; if the server fails (network, 4xx/5xx, 503 with a long Retry-After), answer
 * with the local guess anyway. The exit head's outputs are in token order; {@link ExitDecoder} names
 * the class of its top output. The server answers with a slot; {@link SlotDecoder} maps it to a class,
 * and a slot that names none of this phone's classes also leaves the local answer standing. A
 * classification therefore always has an answer.
 */
public final class HarmonyClient {
    private final InferenceEngine engine;
    private final ExitGate exitGate;
    private final ExitDecoder exits;
    private final FallbackServer fallback;
    private final SlotDecoder slots;
    private final LongSupplier nanoTime;

    /**
     * @param exits names the exit head's outputs (token order) with this phone's classes; required
     * @param fallback the server, or null for local-only operation (offline, or crypto unavailable)
     * @param slots maps the server's slots to this phone's classes; required with a fallback server
     */
    public HarmonyClient(InferenceEngine engine, ExitGate exitGate, ExitDecoder exits, FallbackServer fallback,
            SlotDecoder slots, LongSupplier nanoTime) {
        if (exits == null) {
            throw new IllegalArgumentException("exit heads answer in token order: pass an ExitDecoder");
        }
        if (fallback != null && slots == null) {
            throw new IllegalArgumentException("a fallback server answers in slots: pass a SlotDecoder");
        }
        this.engine = engine;
        this.exitGate = exitGate;
        this.exits = exits;
        this.fallback = fallback;
        this.slots = slots;
        this.nanoTime = nanoTime;
    }

    public HarmonyClient(InferenceEngine engine, ExitGate exitGate, ExitDecoder exits, FallbackServer fallback,
            SlotDecoder slots) {
        this(engine, exitGate, exits, fallback, slots, System::nanoTime);
    }

    public Classification classify(float[] input) throws InferenceException {
        long start = nanoTime.getAsLong();
        FrontEndOutput output = engine.run(input);
        if (output.exitLogits().length != exits.outputs()) {
            throw new InferenceException("the exit head returned " + output.exitLogits().length
                    + " logits; the manifest names " + exits.outputs() + " classes");
        }
        ExitDecision local = exitGate.decide(output.exitLogits(), output.features().data());
        int localClass = exits.classIndex(local.topOutput());
        long localNanos = nanoTime.getAsLong() - start;
        if (local.exitLocally()) {
            return new Classification(Classification.Source.LOCAL_EXIT, localClass, local.confidence(), local,
                    localClass, null, null, localNanos, 0, output.features());
        }
        if (fallback == null) {
            return localAfterFailure(local, localClass, "no fallback server configured", localNanos, 0, output);
        }
        long serverStart = nanoTime.getAsLong();
        try {
            ServerPrediction server = fallback.predict(output.features());
            int serverClass = slots.classIndex(server);
            long serverNanos = nanoTime.getAsLong() - serverStart;
            if (serverClass < 0) {
                String reason = "the server's slot " + server.topSlot() + " (version " + server.modelVersion()
                        + ") names none of this phone's classes";
                return new Classification(Classification.Source.LOCAL_SERVER_UNNAMED, localClass,
                        local.confidence(), local, localClass, server, reason, localNanos, serverNanos, output.features());
            }
            return new Classification(Classification.Source.SERVER, serverClass, server.confidence(), local, localClass,
                    server, null, localNanos, serverNanos, output.features());
        } catch (IOException | ServerException | RuntimeException failure) {
            long serverNanos = nanoTime.getAsLong() - serverStart;
            return localAfterFailure(local, localClass, describe(failure), localNanos, serverNanos, output);
        }
    }

    private static Classification localAfterFailure(ExitDecision local, int localClass, String reason, long localNanos,
            long serverNanos, FrontEndOutput output) {
        return new Classification(Classification.Source.LOCAL_AFTER_SERVER_FAILURE, localClass,
                local.confidence(), local, localClass, null, reason, localNanos, serverNanos, output.features());
    }

    private static String describe(Exception failure) {
        String message = failure.getMessage();
        return failure.getClass().getSimpleName() + (message == null ? "" : ": " + message);
    }
}
