"""`harmony train --engine flower`: training.train's steps with the clients behind a Flower Grid.

The ServerApp runs the server's part of training.py (`start_run(play_clients=False)`,
`finish_server`): meta-weights, back-end, aggregation, checkpoints, the server part of the run
dir. It never reads the federation secret nor holds a client, an image or a label: client turns,
personalization and evaluation run in the ClientApps (server_app.py, client_app.py), which keep
their artifacts in their client part. The run directory comes out in the same layout, so `harmony
export` reads it unchanged; the Flower engine adds `flower_rounds.jsonl` (replies and bytes per
round). Its final metrics have no alignment score: that kNN needs several clients' labelled
features in one place, which federated evaluation does not have.

The ServerApp's body is `server_app.train_on_grid`. `train_flower` runs it on Flower's Simulation
Engine (one virtual SuperNode per client); a deployment runs the same ServerApp/ClientApp through
`flwr run` (flower_app/ in the repo).
"""

from __future__ import annotations

import json
from pathlib import Path

from harmony_mobile.flower.server_app import (  # noqa: F401 (the entry points of the Flower engine)
    FlowerRunError,
    check_supported,
    make_server_app,
    train_on_grid,
)
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.run_dir import ensure_federation_secret
from harmony_mobile.training import check_config, prepare_run_dir

FLOWER_LOGGERS = ("flwr", "ray")  # they print to the terminal themselves unless adopted


def provision_federation_secret(run_path: Path) -> None:
    """Phone side, for engines whose clients run on this machine: a new secret in the run dir's
    client part, where the ClientApps find it (a deployment names its own file in each SuperNode's
    node config instead). The ServerApp never reads it."""
    ensure_federation_secret(run_path)


def quiet_simulation_entry():
    """Flower's `run_simulation`, with Flower's and Ray's log lines (its deprecation notice among
    them) going to harmony's log file instead of the terminal.

    Flower 1.42 deprecates this in-process entry point in favour of `flwr run` against a local
    SuperLink in simulation mode: a detached, long-lived SuperLink on a fixed port (39091) that
    runs the app from flower_app/ in processes it starts, i.e. the deployment path (deployment.py).
    It has no in-process replacement, so harmony keeps it."""
    from flwr.simulation import run_simulation

    from harmony_mobile.logs import adopt_loggers

    adopt_loggers(*FLOWER_LOGGERS)
    return run_simulation


def train_flower(settings: FlowerSettings, backend_config: dict | None = None) -> dict:
    """Train on Flower's Simulation Engine: one virtual SuperNode per client, this process's
    ServerApp writing the run dir. Returns the final metrics."""
    from harmony_mobile.flower.client_app import make_client_app
    from harmony_mobile.flower.settings import client_count

    run_simulation = quiet_simulation_entry()

    config = settings.train_config
    check_supported(config)
    check_config(config)
    prepare_run_dir(Path(settings.run_dir), config)  # bad run dirs fail before Ray starts
    provision_federation_secret(Path(settings.run_dir))
    # the actors' own output (Flower's per-message lines) stays in Ray's session logs
    resources = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": 1, "log_to_driver": False},
    }
    run_simulation(
        server_app=make_server_app(settings),
        client_app=make_client_app(settings),
        num_supernodes=client_count(config),
        backend_config=backend_config or resources,
    )
    return json.loads((Path(settings.run_dir) / "final_metrics.json").read_text())
