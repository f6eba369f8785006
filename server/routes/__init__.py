"""The HTTP endpoints, one router per module, and what they share (request dependencies, body
reading, the V2 helpers). Endpoint modules never import one another (pyproject.toml contracts)."""
