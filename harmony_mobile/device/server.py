"""Former name of device/fallback_client.py, kept only until harmony_mobile/cli.py imports the new
name (it is being edited elsewhere); delete it then."""

from harmony_mobile.device.fallback_client import enrol

__all__ = ["enrol"]
