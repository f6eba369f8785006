"""A round's split turns in lockstep: the server answers step k of every open turn, in the round's
order, before any step k + 1; each turn keeps its own torch random stream; an error surfaces."""

import threading
import time

import pytest
import torch

from harmony_mobile.federation.lockstep import run_in_lockstep


class RecordingServer:
    """Answers every step with the upload's own id and logs the order it answered in."""

    def __init__(self):
        self.answered: list[tuple[str, int]] = []

    def step(self, upload, update=True):
        self.answered.append(upload)
        return upload

    def take_diagnostics(self, client_id):
        return {"steps": sum(1 for name, _ in self.answered if name == client_id)}


def turn(name: str, steps: int, draws: list):
    def body(server):
        torch.manual_seed(len(name) * 1000 + steps)  # as rounds.seed_turn seeds each turn
        for k in range(steps):
            draws.append((name, float(torch.rand(()))))  # the global stream, across the pause
            assert server.step((name, k)) == (name, k)
        return {"name": name, **server.take_diagnostics(name)}

    return body


def test_the_server_answers_step_k_of_every_open_turn_in_order_before_step_k_plus_1():
    server, draws = RecordingServer(), []
    updates = run_in_lockstep(
        server, [(7, turn("c", 3, draws)), (2, turn("a", 1, draws)), (5, turn("b", 2, draws))]
    )
    assert server.answered == [("c", 0), ("a", 0), ("b", 0), ("c", 1), ("b", 1), ("c", 2)]
    assert updates == {
        7: {"name": "c", "steps": 3},
        2: {"name": "a", "steps": 1},
        5: {"name": "b", "steps": 2},
    }


def test_each_turn_draws_the_global_stream_it_would_draw_alone():
    together: list = []
    run_in_lockstep(RecordingServer(), [(0, turn("c", 3, together)), (1, turn("bb", 3, together))])
    for name in ("c", "bb"):
        alone: list = []
        run_in_lockstep(RecordingServer(), [(0, turn(name, 3, alone))])
        assert [d for d in together if d[0] == name] == alone


def test_an_error_in_a_turn_is_raised_to_the_round():
    def failing(server):
        server.step(("x", 0))
        raise RuntimeError("client broke")

    with pytest.raises(RuntimeError, match="client broke"):
        run_in_lockstep(RecordingServer(), [(0, turn("a", 2, [])), (1, failing)])


def test_a_failing_turn_ends_the_turns_still_waiting_for_the_server():
    """Without this, the other turns' threads stayed blocked on an answer for the process's life."""

    def failing(server):
        server.step(("x", 0))
        raise RuntimeError("client broke")

    class FailingServer(RecordingServer):
        def step(self, upload, update=True):
            if upload == ("b", 1):
                raise ValueError("server refused")
            return super().step(upload, update)

    before = set(threading.enumerate())

    def new_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.is_alive()} - before

    with pytest.raises(RuntimeError, match="client broke"):
        run_in_lockstep(RecordingServer(), [(0, turn("a", 5, [])), (1, failing), (2, turn("c", 5, []))])
    with pytest.raises(ValueError, match="server refused"):
        run_in_lockstep(FailingServer(), [(0, turn("a", 5, [])), (1, turn("b", 5, []))])
    deadline = time.monotonic() + 10
    while new_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert new_threads() == set()
