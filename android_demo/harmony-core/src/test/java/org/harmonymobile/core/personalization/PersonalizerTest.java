package org.harmonymobile.core.personalization;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.harmonymobile.core.ExitDecoder;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.exit.Softmax;
import org.harmonymobile.core.json.Json;
import org.junit.jupiter.api.Test;

class PersonalizerTest {
    private static final int CLASSES = 10;
    private static final int HIDDEN = 12;
    private static final int BATCH = 8;
    private static final List<String> CLASS_NAMES =
            List.of("0", "1", "2", "3", "4", "5", "6", "7", "8", "9");
    private static final ExitDecoder EXITS = new ExitDecoder(
            new FederationKey("personalizer-test-secret-32bytes".getBytes(StandardCharsets.UTF_8)), "e-test", CLASS_NAMES);
    private static final PersonalizationSpec SPEC = new PersonalizationSpec(
            null, null, null, "forward", BATCH, HIDDEN, List.of("weight", "bias"), 0.5, 0.9);

    /** A softmax regression with real gradients: the training program's contract, in Java. */
    static final class FakeTrainingModule implements TrainingModule {
        final Map<String, float[]> parameters = new HashMap<>();
        final Map<String, float[]> gradients = new HashMap<>();
        final List<long[]> fedLabels = new ArrayList<>();
        final List<Integer> fedRows = new ArrayList<>();

        FakeTrainingModule() {
            parameters.put("weight", new float[CLASSES * HIDDEN]);
            parameters.put("bias", new float[CLASSES]);
        }

        @Override
        public float forwardBackward(float[] exitHidden, long[] exitPositions) {
            fedLabels.add(exitPositions.clone());
            fedRows.add(exitHidden.length / HIDDEN);
            int rows = exitPositions.length;
            float[] gw = new float[CLASSES * HIDDEN];
            float[] gb = new float[CLASSES];
            double loss = 0;
            float[] logits = FakeHead.compute(exitHidden, rows, parameters);
            for (int r = 0; r < rows; r++) {
                double[] p = Softmax.probabilities(java.util.Arrays.copyOfRange(logits, r * CLASSES, (r + 1) * CLASSES));
                loss -= Math.log(p[(int) exitPositions[r]]);
                for (int c = 0; c < CLASSES; c++) {
                    double d = (p[c] - (c == exitPositions[r] ? 1 : 0)) / rows;
                    gb[c] += (float) d;
                    for (int h = 0; h < HIDDEN; h++) {
                        gw[c * HIDDEN + h] += (float) (d * exitHidden[r * HIDDEN + h]);
                    }
                }
            }
            gradients.put("weight", gw);
            gradients.put("bias", gb);
            return (float) (loss / rows);
        }

        @Override
        public Map<String, float[]> namedGradients() {
            return gradients;
        }

        @Override
        public Map<String, float[]> namedParameters() {
            return parameters;
        }
    }

    static final class FakeHead implements HeadProgram {
        static float[] compute(float[] hidden, int rows, Map<String, float[]> parameters) {
            float[] w = parameters.get("weight");
            float[] b = parameters.get("bias");
            float[] out = new float[rows * CLASSES];
            for (int r = 0; r < rows; r++) {
                for (int c = 0; c < CLASSES; c++) {
                    float sum = b[c];
                    for (int h = 0; h < HIDDEN; h++) {
                        sum += w[c * HIDDEN + h] * hidden[r * HIDDEN + h];
                    }
                    out[r * CLASSES + c] = sum;
                }
            }
            return out;
        }

        @Override
        public float[] logits(float[] exitHidden, int rows, Map<String, float[]> parameters) {
            return compute(exitHidden, rows, parameters);
        }
    }

    /** Samples whose exit_hidden says their class (a bump at position class), plus noise. */
    private static float[][] samples(int[] classes, long seed) {
        SplittableRandom random = new SplittableRandom(seed);
        float[][] hidden = new float[classes.length][HIDDEN];
        for (int i = 0; i < classes.length; i++) {
            for (int h = 0; h < HIDDEN; h++) {
                hidden[i][h] = (float) (random.nextDouble() * 0.3);
            }
            hidden[i][classes[i]] += 1.0f;
        }
        return hidden;
    }

    private static int[] classes(int n) {
        int[] classes = new int[n];
        for (int i = 0; i < n; i++) {
            classes[i] = i % CLASSES;
        }
        return classes;
    }

    private static Personalizer personalizer(FakeTrainingModule module) {
        return new Personalizer(module, p -> new Sgd(p, SPEC.learningRate()), SPEC, EXITS);
    }

    @Test
    void labelsReachTheTrainingProgramAsExitPositions() {
        FakeTrainingModule module = new FakeTrainingModule();
        Personalizer personalizer = personalizer(module);
        int[] classes = classes(40);
        float[][] hidden = samples(classes, 1);
        personalizer.train(hidden, classes, 5, 7);
        boolean reordered = false;
        for (int c = 0; c < CLASSES; c++) {
            assertEquals(c, EXITS.classIndex((int) personalizer.exitPositions(new int[] {c})[0]));
            reordered |= personalizer.exitPositions(new int[] {c})[0] != c;
        }
        assertTrue(reordered, "the secret's exit order must not be the class order here");
        assertEquals(List.of(BATCH, BATCH, BATCH, BATCH, BATCH), module.fedRows);
    }

    @Test
    void eachRowIsFedWithItsOwnSamplesExitPosition() {
        FakeTrainingModule module = new FakeTrainingModule();
        int[] classes = classes(30);
        float[][] hidden = samples(classes, 2);
        // tag each sample: its last exit_hidden value holds its index, so a fed row names the sample it came from
        for (int i = 0; i < hidden.length; i++) {
            hidden[i][HIDDEN - 1] = i;
        }
        Personalizer personalizer = personalizer(module);
        List<float[]> rows = new ArrayList<>();
        TrainingModule recording = new TrainingModule() {
            @Override
            public float forwardBackward(float[] exitHidden, long[] exitPositions) {
                rows.add(exitHidden);
                return module.forwardBackward(exitHidden, exitPositions);
            }

            @Override
            public Map<String, float[]> namedGradients() {
                return module.namedGradients();
            }

            @Override
            public Map<String, float[]> namedParameters() {
                return module.namedParameters();
            }
        };
        new Personalizer(recording, p -> new Sgd(p, 1e-9), SPEC, EXITS).train(hidden, classes, 3, 11);
        long[] positions = personalizer.exitPositions(classes);
        for (int step = 0; step < 3; step++) {
            for (int r = 0; r < BATCH; r++) {
                int sample = (int) rows.get(step)[r * HIDDEN + HIDDEN - 1];
                assertEquals(positions[sample], module.fedLabels.get(step)[r]);
            }
        }
    }

    @Test
    void sgdStepsLowerTheLoss() {
        FakeTrainingModule module = new FakeTrainingModule();
        int[] classes = classes(60);
        List<Float> losses = personalizer(module).train(samples(classes, 3), classes, 80, 5);
        double first = losses.subList(0, 5).stream().mapToDouble(Float::doubleValue).average().orElseThrow();
        double last = losses.subList(75, 80).stream().mapToDouble(Float::doubleValue).average().orElseThrow();
        assertTrue(last < first / 2, "loss " + first + " -> " + last);
    }

    @Test
    void tauIsRecalibratedOnValidationSamplesThroughTheTrainedHead() {
        FakeTrainingModule module = new FakeTrainingModule();
        Personalizer personalizer = personalizer(module);
        int[] classes = classes(60);
        personalizer.train(samples(classes, 4), classes, 60, 6);
        int[] validationClasses = classes(20);
        float[][] validation = samples(validationClasses, 9);
        double tau = personalizer.recalibrate(new FakeHead(), validation, validationClasses, 0.9);

        long[] positions = personalizer.exitPositions(validationClasses);
        float[] confidences = new float[validation.length];
        boolean[] correct = new boolean[validation.length];
        for (int i = 0; i < validation.length; i++) {
            double[] p = Softmax.probabilities(FakeHead.compute(validation[i], 1, module.parameters));
            confidences[i] = (float) p[Softmax.argmax(p)];
            correct[i] = Softmax.argmax(p) == positions[i];
        }
        assertEquals(ThresholdCalibration.calibrate(confidences, correct, 0.9), tau);
        assertTrue(tau > 0.1 && tau <= 1.0, "tau " + tau);
    }

    @Test
    void thresholdRuleKeepsTiesTogether() {
        float[] confidences = {0.9f, 0.8f, 0.8f, 0.7f};
        boolean[] correct = {true, true, false, true};
        assertEquals(0.9f, ThresholdCalibration.calibrate(confidences, correct, 1.0));
        assertEquals(0.7f, ThresholdCalibration.calibrate(confidences, correct, 0.75));
        assertEquals(0.7f, ThresholdCalibration.calibrate(confidences, correct, 0.6));
        assertEquals(Math.nextUp(0.9f), ThresholdCalibration.calibrate(confidences, new boolean[] {false, true, true, true}, 1.0));
        // at 0.8 the tie exits both 0.8 samples: 2 of 3 right, so 0.8 alone never reaches 0.7
        assertEquals(0.9f, ThresholdCalibration.calibrate(new float[] {0.9f, 0.8f, 0.8f}, new boolean[] {true, true, false}, 0.7));
    }

    @Test
    void badInputIsRefused() {
        Personalizer personalizer = personalizer(new FakeTrainingModule());
        assertThrows(IllegalArgumentException.class, () -> personalizer.exitPositions(new int[] {CLASSES}));
        assertThrows(IllegalArgumentException.class, () -> personalizer.train(new float[0][], new int[0], 1, 0));
        assertThrows(IllegalArgumentException.class, () -> personalizer.train(new float[][] {new float[3]}, new int[] {0}, 1, 0));
        assertThrows(IllegalArgumentException.class, () -> new Sgd(Map.of(), 0));
    }

    @Test
    void specIsReadFromTheManifestAndAcceptsOnlyExitPositions() {
        String program = "{\"path\": \"tiers/t/personalize_%s.pte\", \"sha256\": \"" + "a".repeat(64) + "\", \"size\": 10}";
        String json = "{\"scope\": \"exit_classifier\", \"frozen_program\": " + program.formatted("frozen")
                + ", \"training_program\": " + program.formatted("train") + ", \"head_program\": " + program.formatted("head")
                + ", \"method\": \"forward\", \"batch\": 32, \"hidden\": 128, \"parameter_names\": [\"classifier.0.weight\"],"
                + " \"parameter_shapes\": [[64, 128]], \"labels\": \"%s\", \"loss\": \"cross_entropy\", \"optimizer\": \"sgd\","
                + " \"learning_rate\": 0.05, \"calibration_target\": 0.98}";
        PersonalizationSpec spec = PersonalizationSpec.fromJson(Json.parseObject(json.formatted("exit_positions")));
        assertEquals(32, spec.batch());
        assertEquals("tiers/t/personalize_train.pte", spec.trainingProgram().path());
        assertEquals(List.of("classifier.0.weight"), spec.parameterNames());
        assertEquals(0.98, spec.calibrationTarget());
        assertThrows(IllegalArgumentException.class, () -> PersonalizationSpec.fromJson(Json.parseObject(json.formatted("class_ids"))));
    }
}
