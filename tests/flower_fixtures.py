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
    """Nodes 101, 102, ... hold partitions 0, 1, ...; `dead` partitions never answer; a partition in
    `dies_at` answers no message of that round or later (nor personalization), like a SuperNode
    killed then."""

    def __init__(
        self, client_app, num_clients: int, dead: Iterable[int] = (), dies_at: dict[int, int] | None = None
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
        self.dies_at = {101 + p: 0 for p in dead} | {101 + p: r for p, r in (dies_at or {}).items()}
        self.sent: list[str] = []
        self.replies: dict[str, Message] = {}

    def set_run(self, run) -> None:
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, *args, **kwargs) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def silent(self, message: Message) -> bool:
        node, group = message.metadata.dst_node_id, message.metadata.group_id
        if node not in self.dies_at:
            return False
        round_id = int(group) if group.lstrip("-").isdigit() else 0  # query.hello: no round
        return round_id == -1 or round_id >= self.dies_at[node]  # -1: personalization, after the rounds

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Runs each ClientApp now; its reply waits for pull_messages."""
        ids = []
        for index, message in enumerate(messages):
            self.sent.append(message.metadata.message_type)
            message_id = f"{len(self.sent)}-{index}"
            message.metadata.__dict__["_message_id"] = message_id  # as Flower's own in-memory Grid does
            ids.append(message_id)
            if not self.silent(message):
                self.replies[message_id] = self.client_app(
                    message, self.contexts[message.metadata.dst_node_id]
                )
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))
