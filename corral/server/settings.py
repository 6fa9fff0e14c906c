"""The server's settings: one typed class, read from arguments and ``CORRAL_*`` variables.

Nothing here is read at import: :class:`ServerSettings` reads the environment when it is built
(``corral serve`` builds it from its arguments, which take precedence over the environment).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from corral._scheduler import DEFAULT_QUEUE_LIMIT

__all__ = ["ServerSettings"]


class ServerSettings(BaseSettings):
    """How ``corral serve`` runs; every field also reads ``CORRAL_<FIELD>`` from the environment.

    Example::

        ServerSettings(repository="models/", http_port=8080)   # CORRAL_AUTH_TOKEN also read
    """

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="forbid", frozen=True)

    #: The model repository (Triton's layout: <name>/<version>/model.onnx, or <name>.onnx).
    repository: Path
    #: The address both servers bind; loopback unless asked otherwise.
    host: str = "127.0.0.1"
    #: The HTTP port (0: any free port).
    http_port: int = Field(default=8000, ge=0, le=65535)
    #: The gRPC port (0: any free port; -1: no gRPC server).
    grpc_port: int = Field(default=8001, ge=-1, le=65535)
    #: Estimated bytes the loaded models may hold, like "2GiB"; None: no budget.
    memory_budget: str | None = None
    #: Most model versions loaded at once; None: no limit.
    max_loaded_models: int | None = Field(default=None, gt=0)
    #: The Runtime's compute threads; None: the number of cores.
    compute_workers: int | None = Field(default=None, gt=0)
    #: Requests one model version may have queued; more get 429 / RESOURCE_EXHAUSTED at once.
    max_queue_per_model: int = Field(default=DEFAULT_QUEUE_LIMIT, gt=0)
    #: Largest request body accepted, in bytes; larger ones get 413 / RESOURCE_EXHAUSTED.
    max_request_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: When set, every endpoint but health needs ``Authorization: Bearer <token>``.
    auth_token: SecretStr | None = None
    #: How long SIGTERM / SIGINT waits for requests in flight before closing anyway.
    drain_timeout_s: float = Field(default=30.0, ge=0)
    #: Seconds between checks of the repository for changed models; None: no polling.
    poll_interval_s: float | None = Field(default=None, gt=0)
    #: Python logging level for corral's and the servers' logs.
    log_level: str = "info"

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        levels = ("critical", "error", "warning", "info", "debug")
        if value.lower() not in levels:
            raise ValueError(f"log_level must be one of {', '.join(levels)}, got {value!r}")
        return value.lower()
