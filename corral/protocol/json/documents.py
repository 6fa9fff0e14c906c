"""The JSON documents of the HTTP endpoints, built from the data plane's plain records.

The protocol's (KServe v2: server and model metadata) and Triton's (model configuration,
statistics, the repository index, shared memory regions), in the field names and nesting
their clients read. Pure functions of frozen records: no I/O, no state.

Example::

    body = orjson.dumps(metadata_doc(await plane.model_metadata("fraud")))
"""

from __future__ import annotations

from typing import Any

from corral._models import VersionPolicy
from corral.protocol.shm import RegionStatus
from corral.protocol.types import (
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    ServerMetadata,
    TensorConfiguration,
)

__all__ = [
    "config_doc",
    "index_doc",
    "metadata_doc",
    "region_doc",
    "server_doc",
    "stats_doc",
    "version_policy_doc",
]


def server_doc(meta: ServerMetadata) -> dict[str, Any]:
    """``GET /v2``: the server's name, version and extensions."""
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def metadata_doc(meta: ModelMetadata) -> dict[str, Any]:
    """``GET /v2/models/{name}``: a model's versions, platform and tensors."""
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs
        ],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs
        ],
    }


def config_doc(config: ModelConfiguration) -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: Triton's model_config JSON."""

    # The tensor lists are named in the singular, as Triton names them.
    def tensor(t: TensorConfiguration, *, is_input: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": t.name, "data_type": t.data_type, "dims": list(t.dims)}
        if is_input:
            doc["format"] = t.format
        else:
            doc["label_filename"] = t.label_filename
        if t.reshape is not None:
            doc["reshape"] = {"shape": list(t.reshape)}
        return doc

    doc: dict[str, Any] = {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "version_policy": version_policy_doc(config.version_policy),
        "max_batch_size": config.max_batch_size,
        "input": [tensor(t, is_input=True) for t in config.inputs],
        "output": [tensor(t, is_input=False) for t in config.outputs],
        "instance_group": [
            {"name": config.name, "kind": config.instance_kind, "count": config.instance_count}
        ],
        "default_model_filename": config.default_model_filename,
        "parameters": {key: {"string_value": value} for key, value in config.parameters.items()},
    }
    if config.op_library_filenames:
        doc["model_operations"] = {"op_library_filename": list(config.op_library_filenames)}
    if config.batch_window_us is not None:
        doc["dynamic_batching"] = {
            "max_queue_delay_microseconds": config.batch_window_us,
            "default_queue_policy": {
                "max_queue_size": config.max_queue_size,
                "timeout_action": "REJECT",
                "default_timeout_microseconds": config.queue_timeout_us or 0,
                "allow_timeout_override": config.queue_timeout_override,
            },
        }
        if config.preferred_batch_sizes:
            doc["dynamic_batching"]["preferred_batch_size"] = list(config.preferred_batch_sizes)
    return doc


def version_policy_doc(policy: VersionPolicy) -> dict[str, Any]:
    """A version policy as ``/config`` gives it (Triton's JSON), for the status page too."""
    if policy.kind == "latest":
        return {"latest": {"num_versions": policy.count}}
    if policy.kind == "all":
        return {"all": {}}
    return {"specific": {"versions": list(policy.versions)}}


def stats_doc(rows: list[ModelStatistics]) -> dict[str, Any]:
    """``GET /v2/models[/{name}]/stats``: Triton's statistics extension."""

    def duration(d: Any) -> dict[str, int]:
        return {"count": d.count, "ns": d.ns}

    return {
        "model_stats": [
            {
                "name": row.name,
                "version": row.version,
                "last_inference": row.last_inference,
                "inference_count": row.inference_count,
                "execution_count": row.execution_count,
                "inference_stats": {
                    "success": duration(row.success),
                    "fail": duration(row.fail),
                    "queue": duration(row.queue),
                    "compute_input": duration(row.compute_input),
                    "compute_infer": duration(row.compute_infer),
                    "compute_output": duration(row.compute_output),
                    "cache_hit": duration(row.cache_hit),
                    "cache_miss": duration(row.cache_miss),
                },
                "batch_stats": [
                    {"batch_size": b.batch_size, "compute_infer": duration(b.compute_infer)}
                    for b in row.batch_stats
                ],
            }
            for row in rows
        ]
    }


def index_doc(row: RepositoryModel) -> dict[str, str]:
    """One row of ``POST /v2/repository/index``."""
    doc = {"name": row.name, "state": row.state}
    if row.version:
        doc["version"] = row.version
    if row.reason:
        doc["reason"] = row.reason
    return doc


def region_doc(row: RegionStatus) -> dict[str, Any]:
    """One row of a shared memory status answer."""
    return {"name": row.name, "key": row.key, "offset": row.offset, "byte_size": row.byte_size}
