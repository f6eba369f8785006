"""Former name of server/http_guards.py, kept only until server/app.py and server/launch.py import
the new name (they are being edited elsewhere); delete it then."""

from harmony_mobile.server.http_guards import GuardedHttpToolsProtocol

__all__ = ["GuardedHttpToolsProtocol"]
