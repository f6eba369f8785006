package org.harmonymobile.core.personalization;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.function.Function;
import org.harmonymobile.core.ExitDecoder;
import org.harmonymobile.core.exit.Softmax;

/**
 * The training loop's data path on the phone: its own samples (exit_hidden rows from the frozen
 * program, class indices of the labels the user confirmed) become batches of exactly
 * {@code spec.batch()} rows, drawn with replacement from a seeded stream; labels become exit
 * positions through the federation secret ({@link ExitDecoder}: the exit head's outputs are in token
 * order), so the training program never sees a class index; each step is a forward-backward through
 * the {@link TrainingModule} and an {@link Optimizer} step. Afterwards tau is recalibrated on the
 * phone's own validation samples through the {@link HeadProgram} fed the trained parameters.
 * Nothing here leaves the phone. Python counterpart: harmony_mobile/device/personalization.py.
 */
public final class Personalizer {
    private final TrainingModule module;
    private final Function<Map<String, float[]>, Optimizer> optimizers;
    private final PersonalizationSpec spec;
    private final int[] outputOfClass;
    private Optimizer optimizer;

    /**
     * @param optimizers makes the optimizer over the module's parameters once they exist (after the
     *     first forward-backward), e.g. {@code p -> new Sgd(p, spec.learningRate())}
     */
    public Personalizer(
            TrainingModule module,
            Function<Map<String, float[]>, Optimizer> optimizers,
            PersonalizationSpec spec,
            ExitDecoder exits) {
        this.module = module;
        this.optimizers = optimizers;
        this.spec = spec;
        this.outputOfClass = new int[exits.outputs()];
        for (int output = 0; output < exits.outputs(); output++) {
            outputOfClass[exits.classIndex(output)] = output;
        }
    }

    /** The exit output of each class index: what the training program is fed. */
    public long[] exitPositions(int[] classIndices) {
        long[] positions = new long[classIndices.length];
        for (int i = 0; i < classIndices.length; i++) {
            int c = classIndices[i];
            if (c < 0 || c >= outputOfClass.length) {
                throw new IllegalArgumentException("class index " + c + " is not one of the " + outputOfClass.length + " classes");
            }
            positions[i] = outputOfClass[c];
        }
        return positions;
    }

    /** {@code steps} training steps on the phone's samples; returns each step's loss. */
    public List<Float> train(float[][] exitHidden, int[] classIndices, int steps, long seed) {
        if (exitHidden.length == 0 || exitHidden.length != classIndices.length) {
            throw new IllegalArgumentException(exitHidden.length + " samples and " + classIndices.length + " labels: need as many, and at least one");
        }
        long[] positions = exitPositions(classIndices);
        SplittableRandom random = new SplittableRandom(seed);
        List<Float> losses = new ArrayList<>(steps);
        float[] rows = new float[spec.batch() * spec.hidden()];
        long[] labels = new long[spec.batch()];
        for (int step = 0; step < steps; step++) {
            for (int r = 0; r < spec.batch(); r++) {
                int sample = random.nextInt(exitHidden.length);
                if (exitHidden[sample].length != spec.hidden()) {
                    throw new IllegalArgumentException("sample " + sample + " has " + exitHidden[sample].length + " exit_hidden values, the program takes " + spec.hidden());
                }
                System.arraycopy(exitHidden[sample], 0, rows, r * spec.hidden(), spec.hidden());
                labels[r] = positions[sample];
            }
            losses.add(module.forwardBackward(rows.clone(), labels.clone()));
            if (optimizer == null) {
                optimizer = optimizers.apply(module.namedParameters());
            }
            optimizer.step(module.namedGradients());
        }
        return losses;
    }

    /** tau of the personalized exit on the phone's validation samples, for {@code targetAccuracy}. */
    public double recalibrate(HeadProgram head, float[][] validationHidden, int[] validationClasses, double targetAccuracy) {
        if (validationHidden.length != validationClasses.length) {
            throw new IllegalArgumentException(validationHidden.length + " validation samples but " + validationClasses.length + " labels");
        }
        long[] positions = exitPositions(validationClasses);
        int outputs = outputOfClass.length;
        float[] rows = new float[validationHidden.length * spec.hidden()];
        for (int i = 0; i < validationHidden.length; i++) {
            System.arraycopy(validationHidden[i], 0, rows, i * spec.hidden(), spec.hidden());
        }
        float[] logits = head.logits(rows, validationHidden.length, module.namedParameters());
        float[] confidences = new float[validationHidden.length];
        boolean[] correct = new boolean[validationHidden.length];
        for (int i = 0; i < validationHidden.length; i++) {
            float[] row = java.util.Arrays.copyOfRange(logits, i * outputs, (i + 1) * outputs);
            double[] probabilities = Softmax.probabilities(row);
            int best = Softmax.argmax(probabilities);
            confidences[i] = (float) probabilities[best];
            correct[i] = best == positions[i];
        }
        return ThresholdCalibration.calibrate(confidences, correct, targetAccuracy);
    }
}
