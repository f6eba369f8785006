package org.harmonymobile.core.personalization;

import java.util.Map;

/** Plain SGD, in place: p -= learningRate * g for every parameter that has a gradient. */
public final class Sgd implements Optimizer {
    private final Map<String, float[]> parameters;
    private final double learningRate;

    public Sgd(Map<String, float[]> parameters, double learningRate) {
        if (!(learningRate > 0) || Double.isInfinite(learningRate)) {
            throw new IllegalArgumentException("the learning rate must be a finite number > 0, got " + learningRate);
        }
        this.parameters = parameters;
        this.learningRate = learningRate;
    }

    @Override
    public void step(Map<String, float[]> namedGradients) {
        for (Map.Entry<String, float[]> gradient : namedGradients.entrySet()) {
            float[] parameter = parameters.get(gradient.getKey());
            if (parameter == null || parameter.length != gradient.getValue().length) {
                throw new IllegalArgumentException("gradient " + gradient.getKey() + " matches no parameter of its size");
            }
            float[] g = gradient.getValue();
            for (int i = 0; i < parameter.length; i++) {
                parameter[i] -= (float) (learningRate * g[i]);
            }
        }
    }
}
