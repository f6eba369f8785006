"""Write the app's OpenAPI schema: `python -m harmony_mobile.server.openapi > server/openapi.json`.

The committed file is the contract other tools read (schemathesis, client generators);
tests/test_server_openapi.py fails when it is stale.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from harmony_mobile.server.app import create_app
from harmony_mobile.server.core.settings import Settings


def openapi_document() -> str:
    """The schema of an app on a throwaway data dir (the schema does not depend on state)."""
    with tempfile.TemporaryDirectory() as scratch:
        app = create_app(Settings(data_dir=Path(scratch), admin_token="unused-for-schema"))
        schema = app.openapi()
        app.state.harmony.store.close()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(openapi_document())
