package org.harmonymobile.core;

import java.util.List;
import org.harmonymobile.core.util.Immutable;

/**
 * Names the outputs of the tier's exit head (docs/PROTOCOL.md 3, "Exit output -> class"). Exit heads
 * are trained and shipped in token order: output j is the class whose label token under the manifest's
 * label epoch is the j-th smallest (unsigned byte order, {@code LabelTokens.exitOrder}), so a model
 * that leaves a phone carries no class order and only a holder of the federation secret can tell which
 * output is which class. The early-exit rule (max softmax vs the threshold) does not depend on it.
 */
public final class ExitDecoder {
    private final List<String> classNames;
    private final List<String> exitClasses;
    private final int[] classOfOutput;

    /**
     * @param labelEpoch the manifest's {@code label_epoch} (the epoch the front-end was trained in)
     * @param classNames the manifest's {@code class_names}
     */
    public ExitDecoder(FederationKey federationKey, String labelEpoch, List<String> classNames) {
        this.classNames = Immutable.list(classNames);
        this.exitClasses = Immutable.list(federationKey.tokens(labelEpoch).exitOrder(this.classNames));
        this.classOfOutput = new int[exitClasses.size()];
        for (int j = 0; j < classOfOutput.length; j++) {
            classOfOutput[j] = this.classNames.indexOf(exitClasses.get(j));
        }
    }

    /** The number of outputs the exit head has: one per class name. */
    public int outputs() {
        return classOfOutput.length;
    }

    /** The class name of each output: entry j names output j. */
    public List<String> exitClasses() {
        return exitClasses;
    }

    /**
     * The index in the manifest's class names of exit output {@code output}; -1 for -1 (an
     * {@code ExitDecision} over non-finite logits, which names no output).
     */
    public int classIndex(int output) {
        if (output == -1) {
            return -1;
        }
        if (output < 0 || output >= classOfOutput.length) {
            throw new IndexOutOfBoundsException(
                    "exit output " + output + " of a head with " + classOfOutput.length + " outputs");
        }
        return classOfOutput[output];
    }
}
