"""The fallback server's services: the store, the model registry and runtimes, the micro-batcher,
alignment rounds, uploads and the status page's history. They use server.core, never the routes."""
