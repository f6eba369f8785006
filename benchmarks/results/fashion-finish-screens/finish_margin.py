"""Scratch screen, kept: gate-aware personalization. finish_again.py's end of a saved `fashion` run
once more, with one term added to the joint personalization epoch: the phone's own samples pushed
towards its own slots' prototypes and away from the nearest other slot's (the slot gate's margin,
prototypes made by the server from its back-end and a replay set of the front-ends before the
personalization, as the gate makes them after it). Appends rows to OUT/finish_rows.jsonl in
finish_again.py's format (compare with its `--compare`).

    python finish_margin.py RUN_DIR VARIANT OUT     # VARIANT: base, or m<weight>_<hinge>, e.g. m1.0_0.5
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from finish_again import finish_row, settings_before_the_step, start_again  # noqa: E402

from harmony_mobile.algorithms import base  # noqa: E402
from harmony_mobile.algorithms.registry import build_algorithm  # noqa: E402
from harmony_mobile.federation.replay import collect_replay  # noqa: E402
from harmony_mobile.federation.rounds import personalization_round, seed_turn  # noqa: E402
from harmony_mobile.federation.slot_gate import slot_prototypes  # noqa: E402
from harmony_mobile.protocol.slot_gate import slot_margin  # noqa: E402

GATE: dict = {}  # the client being personalized: its prototypes, own slots, weight and hinge
exit_loss = base.exit_loss_and_activation


def with_margin(model, images, labels, depth, logit_norm):
    """The exit loss plus weight x the mean hinge of the slot margin of the samples' features."""
    loss, activation = exit_loss(model, images, labels, depth, logit_norm)
    if GATE:
        features = model.connectors[str(depth)](activation)
        margin = slot_margin(features, GATE["prototypes"], GATE["own"])
        loss = loss + GATE["weight"] * F.relu(GATE["hinge"] - margin).mean()
    return loss, activation


def finish_with_margin(src: Path, variant: str, out: Path) -> dict:
    started = time.time()
    config, run, history = start_again(src, variant, out)
    settings = settings_before_the_step(src) | dict(config.algorithm_config)
    run.federation.algorithm = build_algorithm(config.algorithm, settings)
    tokens = run.federation.server.slot_table.tokens
    if variant != "base":
        weight, hinge = (float(part) for part in variant[1:].split("_"))
        replay = collect_replay(run.clients, config.seed)
        prototypes = slot_prototypes(run.backend.eval(), len(tokens), replay)
        base.exit_loss_and_activation = with_margin
    for index, client in enumerate(run.clients):
        run.federation.broadcast(client)
        if variant != "base":
            GATE.update(prototypes=prototypes, own=client.own_slots(tokens), weight=weight, hinge=hinge)
        generator = seed_turn(config.seed, personalization_round(config.rounds), index)
        run.federation.algorithm.personalize(client, run.federation.server, generator)
    GATE.clear()
    return finish_row(src, variant, run, history, started)


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    row = finish_with_margin(Path(sys.argv[1]), sys.argv[2], out)
    with open(out / "finish_rows.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps(row))
