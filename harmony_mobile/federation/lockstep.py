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


class TurnAbandonedError(RuntimeError):
    """Nobody will answer this paused turn: its thread ends quietly."""


_ABANDONED = object()


class PausableTurn:
    """A body run in a thread of its own, only while its driver waits for it. The body calls `pause`
    at each split step; `start` and `answer` hand control to the turn and return its next event:
    ("step", request) when it pauses, ("done", result) when it ends; an error inside the body is
    raised from them. Its torch global random state is kept across pauses (other turns run
    meanwhile), as a process of its own would keep it, and so is its OpenMP thread count."""

    def __init__(self, name: str = "turn", threads: int | None = None):
        self.name = name
        # OpenMP's thread count is per thread: the turn's thread takes its driver's, or `threads`
        self.threads = threads if threads is not None else torch.get_num_threads()
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # turn -> driver
        self.answers: queue.SimpleQueue = queue.SimpleQueue()  # driver -> turn

    def start(self, body: Callable[[], Any]) -> tuple[str, Any]:
        threading.Thread(target=self._main, args=(body,), daemon=True, name=self.name).start()
        return self.next_event()

    def answer(self, value: Any) -> tuple[str, Any]:
        self.answers.put(value)
        return self.next_event()

    def abandon(self) -> None:
        """End a paused turn without an answer (its `pause` raises TurnAbandonedError)."""
        self.answers.put(_ABANDONED)

    def pause(self, request: Any) -> Any:
        """In the turn's thread: hand `request` to the driver and wait for its answer."""
        random_state = torch.get_rng_state()
        self.events.put(("step", request))
        answer = self.answers.get()
        if answer is _ABANDONED:
            raise TurnAbandonedError(f"{self.name} abandoned")
        torch.set_rng_state(random_state)
        return answer

    def next_event(self) -> tuple[str, Any]:
        kind, value = self.events.get()
        if kind == "error":
            raise value
        return kind, value

    def _main(self, body: Callable[[], Any]) -> None:
        torch.set_num_threads(self.threads)
        try:
            self.events.put(("done", body()))
        except TurnAbandonedError:
            pass
        except BaseException as error:  # noqa: BLE001 (re-raised in the driver's thread)
            self.events.put(("error", error))


class PausedServer:
    """The server as one turn's thread sees it: a split step pauses the turn until the driver has
    the server answer it."""

    def __init__(self, server: SplitTrainer, turn: PausableTurn):
        self.server, self.turn = server, turn

    def step(self, upload: FeatureUpload, update: bool = True) -> InterfaceGradients:
        return self.turn.pause((upload, update))

    def take_diagnostics(self, client_id: str) -> dict[str, float]:
        return self.server.take_diagnostics(client_id)  # the driver waits while a turn runs


def run_in_lockstep(server: SplitTrainer, turns: list[tuple[int, TurnBody]]) -> dict[int, ClientUpdate]:
    """Run the turns (client id, body) in lockstep; each client's update by id. One tick answers
    the waiting split step of every open turn, in the order of `turns`. A turn that fails ends
    the others (their threads end) and its error is raised."""
    threaded = {client_id: PausableTurn(f"turn-{client_id}") for client_id, _ in turns}
    events: dict[int, tuple[str, Any]] = {}
    try:
        for client_id, body in turns:
            view = PausedServer(server, threaded[client_id])
            events[client_id] = threaded[client_id].start(lambda body=body, view=view: body(view))
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
    finally:
        for client_id in events:  # turns still open when one failed (abandoning an ended one is a no-op)
            threaded[client_id].abandon()
