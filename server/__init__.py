"""The FastAPI fallback server (installed as harmony_mobile.server): `create_app(Settings(...))`."""

from harmony_mobile.server.app import create_app
from harmony_mobile.server.core.settings import Settings

__all__ = ["Settings", "create_app"]
