"""Privacy primitives: label tokens (label_tokens.py), sealed uploads (sealing.py), label DP by
randomized response (label_dp.py), feature clipping + Gaussian noise and its accounting
(feature_noise.py), and the options that switch the last two on (options.py)."""
