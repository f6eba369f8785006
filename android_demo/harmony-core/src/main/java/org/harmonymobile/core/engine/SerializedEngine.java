package org.harmonymobile.core.engine;

/**
 * An engine whose {@code run} and {@code close} never overlap. ExecuTorch's {@code Module.destroy()}
 * throws while a method is executing, and an Android activity closes its engine on rotation or
 * re-enrolment while a background inference may still be running; here {@code close} waits for a
 * running inference to finish, and a {@code run} after {@code close} fails with a clear
 * {@link InferenceException} instead of touching a destroyed module.
 */
public final class SerializedEngine implements InferenceEngine {
    private final InferenceEngine engine;
    private final Object lock = new Object();
    private boolean closed;

    public SerializedEngine(InferenceEngine engine) {
        this.engine = engine;
    }

    @Override
    public FrontEndOutput run(float[] input) throws InferenceException {
        synchronized (lock) {
            if (closed) {
                throw new InferenceException("the engine was closed (the model was unloaded)");
            }
            return engine.run(input);
        }
    }

    /** Waits for a running inference, then closes the wrapped engine once; later calls do nothing. */
    @Override
    public void close() {
        synchronized (lock) {
            if (!closed) {
                closed = true;
                engine.close();
            }
        }
    }
}
