"""Privacy primitives: label tokens, sealed uploads, feature clipping and noise."""
