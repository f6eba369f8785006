"""The bottom layer of the fallback server: settings, error bodies, middleware, metrics, the V2
codec, API schemas and key/token helpers. Nothing here imports the services or the routes
(import-linter contract in pyproject.toml)."""
