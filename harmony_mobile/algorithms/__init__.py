"""Training methods: HARMONY, its ablations and the baselines, all behind the `Algorithm` protocol
(base.py); registry.py names them. Nothing is imported here, so server code can use `losses`
without loading the client-side methods."""
