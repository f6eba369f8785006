"""`harmony demo`: the whole product end to end on bundled data (see run.py)."""

from harmony_mobile.demo.run import PHASES, DemoConfig, DemoError, recovery_rows, run_demo, to_pixels

__all__ = ["PHASES", "DemoConfig", "DemoError", "recovery_rows", "run_demo", "to_pixels"]
