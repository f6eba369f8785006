package org.harmonymobile.core;

import org.harmonymobile.core.exit.ExitDecision;
import org.harmonymobile.core.server.ServerPrediction;
import org.harmonymobile.core.wire.FeatureTensor;

/**
 * The answer for one image and how it was reached.
 *
 * @param source who answered
 * @param predictedClass the answer; -1 only if the local front-end produced non-finite logits and the server failed
 * @param confidence max softmax probability behind the answer
 * @param local the early-exit decision (always computed); its top output is in token order
 * @param localClass the class index of the exit head's answer (its top output named by {@link ExitDecoder});
 *     -1 only for non-finite logits
 * @param server the server's prediction, or null if the server was not asked or failed
 * @param serverError why the fallback failed or could not name a class, or null
 * @param features the interface features (kept so a user-confirmed label can be uploaded)
 */
public record Classification(
        Source source,
        int predictedClass,
        double confidence,
        ExitDecision local,
        int localClass,
        ServerPrediction server,
        String serverError,
        long localLatencyNanos,
        long serverLatencyNanos,
        FeatureTensor features) {

    public enum Source {
        /** The exit head was confident: answered on the phone. */
        LOCAL_EXIT,
        /** The exit head was not confident: the server back-end answered. */
        SERVER,
        /** Not confident, but the server failed or is not configured: the phone's own best guess. */
        LOCAL_AFTER_SERVER_FAILURE,
        /** Not confident; the server answered with a slot that names none of this phone's classes. */
        LOCAL_SERVER_UNNAMED
    }
}
