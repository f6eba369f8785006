"""A round's split turns in lockstep, the one order of server steps both engines follow.

A split method's back-end learns from every upload, so the order of the server's steps is part of
the arithmetic. Lockstep fixes it without making clients wait for one another's whole turn: every
sampled client runs its turn until its next split step; the server then answers the waiting steps
in the round's client order; the clients go on to their next step; and so on until every turn has
ended. On Flower the clients' local work between two steps runs at once on their SuperNodes
(flower/server_app.py holds the step requests of a tick until every open turn has sent one); in
this process each turn is a thread and the threads take turns, one computing at a time.

A client reads nothing of the server between its steps but their answers (and, at the end of its
turn, the server's measurements on its own uploads), so answering a step as soon as its turn in
the order comes, rather than after the whole tick, gives the same numbers.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.protocol.messages import ClientUpdate, FeatureUpload, InterfaceGradients

# a turn to run: given the server it talks to, the client's update at the end of its turn
TurnBody = Callable[[Any], ClientUpdate]


class PausedServer:
    """The server as one turn's thread sees it: a split step hands the upload to the scheduler and
    waits for the answer; the thread's torch global random state is kept across the wait (other
    turns run meanwhile), as a process of its own would keep it."""

    def __init__(self, server: SplitTrainer):
        self.server = server
        self.requests: queue.SimpleQueue = queue.SimpleQueue()  # turn -> scheduler: events
        self.answers: queue.SimpleQueue = queue.SimpleQueue()  # scheduler -> turn: gradients

    def step(self, upload: FeatureUpload, update: bool = True) -> InterfaceGradients:
        random_state = torch.get_rng_state()
        self.requests.put(("step", (upload, update)))
        answer = self.answers.get()
        torch.set_rng_state(random_state)
        return answer

    def take_diagnostics(self, client_id: str) -> dict[str, float]:
        return self.server.take_diagnostics(client_id)  # the scheduler waits while a turn runs


class ThreadedTurn:
    """One client's turn in a thread of its own, run only while the scheduler waits for it."""

    def __init__(self, body: TurnBody, server: SplitTrainer):
        self.view = PausedServer(server)
        threads = torch.get_num_threads()  # OpenMP's thread count is per thread
        self.thread = threading.Thread(target=self._main, args=(body, threads), daemon=True)

    def _main(self, body: TurnBody, threads: int) -> None:
        torch.set_num_threads(threads)
        try:
            self.view.requests.put(("done", body(self.view)))
        except BaseException as error:  # noqa: BLE001 (re-raised in the scheduler's thread)
            self.view.requests.put(("error", error))

    def start(self) -> tuple[str, Any]:
        self.thread.start()
        return self._next_event()

    def answer(self, gradients: InterfaceGradients) -> tuple[str, Any]:
        self.view.answers.put(gradients)
        return self._next_event()

    def _next_event(self) -> tuple[str, Any]:
        kind, value = self.view.requests.get()
        if kind == "error":
            self.thread.join()
            raise value
        return kind, value


def run_in_lockstep(server: SplitTrainer, turns: list[tuple[int, TurnBody]]) -> dict[int, ClientUpdate]:
    """Run the turns (client id, body) in lockstep; each client's update by id. One tick answers
    the waiting split step of every open turn, in the order of `turns`."""
    threaded = {client_id: ThreadedTurn(body, server) for client_id, body in turns}
    events = {client_id: turn.start() for client_id, turn in threaded.items()}
    updates: dict[int, ClientUpdate] = {}
    while events:
        for client_id in list(events):  # dict order: the order of `turns`
            kind, value = events[client_id]
            if kind == "done":
                updates[client_id] = value
                del events[client_id]
                continue
            upload, update = value
            events[client_id] = threaded[client_id].answer(server.step(upload, update=update))
    return updates
