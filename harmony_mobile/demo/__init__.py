"""`harmony demo`: the whole product end to end on bundled data, on one machine.

    1. train      HARMONY on mnist5k with the default heterogeneous tiers (small budget)
    2. export     every tier: fp32/int8 .pte, Core ML packages, back-end, signed manifest
    3. serve      `harmony serve` in a subprocess on a free loopback port
    4. deploy     one simulated phone per tier (harmony_mobile.device: pinned manifest, the tier's
                  int8 .pte on the ExecuTorch runtime, local exit or server fallback) classifies its
                  own test data, ID + OOD (p = 0.5); users confirm labels of some local samples:
                  sealed uploads with label tokens
    5. drift      phones personalize on device: SGD steps of their exit classifier on their own
                  data through the export's ExecuTorch training .pte (labels as exit positions), then
                  they answer with the trained parameters and recalibrate their exit threshold tau on
                  their own validation samples (same rule and target as training); the same steps in
                  eager PyTorch give the steps/s ratio
    6. outage     the server stops: phones answer locally and queue sealed uploads of newly confirmed
                  samples durably; after the restart the queues are delivered exactly once
    7. align      the operator starts an alignment round over the admin API and waits for the new
                  back-end version
    8. recover    phones classify again against the aligned back-end

Everything lands in the output directory (default ./demo-output): run/, export/, server/ (data dir
and log), phones/ (upload queues, personalized parameters), demo-report.md, demo-report.json and plots.
The server process is stopped on every exit path (normal end, error, Ctrl-C, SIGTERM).

This is a composition root like cli.py: it imports harmony_mobile.export lazily and talks to the
server only over HTTP.

The package, one module per idea:

    config.py          DemoConfig, DemoError, the phase names
    server_process.py  `harmony serve` in a subprocess (stopped on every exit path)
    phones.py          each phone's data and what it does in a phase (classify, confirm, upload)
    drift.py           stage 5: on-device personalization through the training .pte, tau recalibration
    report.py          console tables, demo-report.md/.json, plots
    run.py             run_demo: the stages in order
"""

from harmony_mobile.demo.config import PHASES, DemoConfig, DemoError
from harmony_mobile.demo.phones import to_pixels
from harmony_mobile.demo.report import recovery_rows
from harmony_mobile.demo.run import run_demo

__all__ = ["PHASES", "DemoConfig", "DemoError", "recovery_rows", "run_demo", "to_pixels"]
