"""Training methods: HARMONY and its baselines, all behind one small `Algorithm` protocol."""
