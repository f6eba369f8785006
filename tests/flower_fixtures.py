"""A Flower Grid that delivers messages to ClientApps in this process, for fast tests of the
ServerApp's logic (rounds, missing replies, resume) without Ray or SuperLink processes. The real
engines are tested too (test_flower_engines.py); this one only replaces the transport."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

# A Message records the sending task; outside a Flower runtime nothing has set it. The test grid
# plays the runtime's part, so it sets the identity a SuperLink would give the ServerApp.
from flwr.supercore.task_identity import TaskIdentity


class LoopbackGrid(Grid):
    """Nodes 101, 102, ... hold partitions 0, 1, ...; `dead` partitions never answer."""

    def __init__(
        self, client_app, num_clients: int, dead: Iterable[int] = (), fail_from_round: int | None = None
    ):
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.client_app = client_app
        self.contexts = {
            101 + p: Context(
                run_id=1,
                node_id=101 + p,
                node_config={"partition-id": p, "num-partitions": num_clients},
                state=RecordDict(),
                run_config={},
            )
            for p in range(num_clients)
        }
        self.dead = {101 + p for p in dead}
        self.fail_from_round = fail_from_round  # from this round on, every node is silent
        self.sent: list[str] = []

    def set_run(self, run) -> None:
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, *args, **kwargs) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.sent.append(message.metadata.message_type)
            group = message.metadata.group_id
            silent = (
                self.fail_from_round is not None and group.isdigit() and int(group) >= self.fail_from_round
            )
            if node in self.dead or silent:
                continue
            replies.append(self.client_app(message, self.contexts[node]))
        return replies
