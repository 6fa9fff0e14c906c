"""HotModels: each model's requests in flight at an ingress, and where the next one goes.

Ray routes a model's requests to the replicas that hold it (its multiplexed model id), so a
model that takes most of the traffic would stay on one replica. Past ``threshold`` requests
of a model in flight at the ingress, both protocols together, its further inference requests
go without the model's id: Ray's own routing (the shorter queue of two replicas) spreads them
over every replica, and a replica that does not hold the model loads it under its own budget
(issue 50, part 2). A spread request the replica refused for want of room or capacity (HTTP
503, gRPC UNAVAILABLE) is sent once more to the model's own replicas. Nothing here imports
Ray: the ingress hands in the two ways to send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["HotModels"]

Answer = TypeVar("Answer")


class HotModels:
    """Each model's requests in flight at one ingress; only its event loop touches them.

    ``threshold``: requests in flight past which a model's inference requests are spread
    (0: never).
    """

    def __init__(self, threshold: int) -> None:
        self._threshold = threshold
        # Each model's requests in flight. Only the ingress's event loop touches it.
        self._in_flight: dict[str, int] = {}

    async def send(
        self,
        name: str,
        *,
        spread: bool,
        to_its_own: Callable[[], Awaitable[Answer]],
        to_any: Callable[[], Awaitable[Answer]],
        refused: Callable[[Answer], bool],
    ) -> Answer:
        """One request of model ``name``: to its own replicas, or to any while it is hot.

        ``spread``: whether the request may go to any replica (inference only: metadata,
        readiness and statistics are the model's own replicas'). An answer ``to_any`` gave
        that ``refused`` says the replica could not take is replaced by ``to_its_own``'s.
        """
        in_flight = self._in_flight.get(name, 0)
        self._in_flight[name] = in_flight + 1
        try:
            if spread and self._threshold and in_flight >= self._threshold:
                answer = await to_any()
                if not refused(answer):
                    return answer
            return await to_its_own()
        finally:
            left = self._in_flight[name] - 1
            if left:
                self._in_flight[name] = left
            else:
                del self._in_flight[name]
