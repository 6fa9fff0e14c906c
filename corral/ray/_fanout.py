"""One answer from every replica's: the deployment's view of what each process sees alone.

Some endpoints answer for one process in ``corral serve``: the repository's index, loads and
unloads, statistics, ``/metrics`` and the status page. On Ray Serve the ingress asks every
model replica (Ray's ``broadcast``) and makes one answer of theirs here, as Triton's meaning
asks: an index row per model version in its most advanced state, statistics summed, each
metric series labelled by the replica it came from, a status document per replica, and a load
or unload answered 200 only when every replica's was. An answer that cannot be merged
(a replica that failed, a body that is not what the endpoint gives) becomes the request's
error, naming the replica: a deployment's figures are never silently a part of them.

The same over gRPC (:class:`GrpcReply`): the index and statistics messages merged as their
JSON forms are, a load or unload OK only when every replica's was.

Nothing here imports Ray: the ingresses hand in each replica's :class:`Reply` or
:class:`GrpcReply`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from google.protobuf.message import DecodeError

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.ray._exchange import REPLICA_HEADER, Headers, HttpAnswer
from corral.ray._grpc_exchange import GrpcAnswer

__all__ = [
    "FANOUT_TIMEOUT_S",
    "FanoutError",
    "GrpcFailed",
    "GrpcReply",
    "Reply",
    "all_succeeded",
    "every_status",
    "grpc_all_succeeded",
    "grpc_merged_index",
    "grpc_summed_statistics",
    "labelled_metrics",
    "merged_index",
    "passed_answer",
    "summed_statistics",
]

#: Seconds an ingress waits for every replica's answer to a call asked of all of them:
#: longer than a replica's own bounds (a load's timeout, an unload's drain).
FANOUT_TIMEOUT_S = 600.0

_JSON = ((b"content-type", b"application/json"),)
# Triton's index states, from the least to the most advanced: a model version is shown in
# the most advanced state any replica has it in.
_STATE_ORDER = {"UNAVAILABLE": 0, "UNLOADING": 1, "LOADING": 2, "READY": 3}


@dataclass(frozen=True, slots=True)
class Reply:
    """One replica's answer to a request every replica was asked."""

    #: Ray's replica id (the answer's ``corral-replica`` header).
    replica: str
    answer: HttpAnswer

    @staticmethod
    def of(answer: HttpAnswer) -> Reply:
        """The reply ``answer`` is, named by its ``corral-replica`` header."""
        for key, value in answer.headers:
            if key == REPLICA_HEADER:
                return Reply(value.decode("latin-1"), answer)
        raise FanoutError(f"a replica's answer (status {answer.status}) does not name its replica")


class FanoutError(Exception):
    """The replicas' answers could not be made into one; the message says whose and why."""


def all_succeeded(replies: Sequence[Reply]) -> HttpAnswer:
    """A load's or unload's answer: the first replica's if each succeeded, else a failure's.

    A failure's own status and body are kept (Triton's clients match on its words), with the
    replica that gave it and how many replicas succeeded added to the message.
    """
    failed = [reply for reply in replies if not 200 <= reply.answer.status < 300]
    if not failed:
        return replies[0].answer
    first = failed[0]
    succeeded = len(replies) - len(failed)
    message = _error_text(first.answer)
    note = f" (replica {first.replica}; {succeeded} of {len(replies)} replicas succeeded)"
    return _json(first.answer.status, {"error": message + note}, first.answer.headers)


def merged_index(replies: Sequence[Reply]) -> HttpAnswer:
    """``POST /v2/repository/index``: each model version once, in its most advanced state.

    A version ready on one replica is ready for the deployment; its reason (why it failed
    to load, say) is the replica's that gave the state shown.
    """
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for reply in _succeeded(replies):
        for row in _body(reply, list):
            key = (str(row.get("name")), str(row.get("version", "")))
            kept = rows.get(key)
            if kept is None or _rank(row) > _rank(kept):
                rows[key] = row
    return _json(200, [rows[key] for key in sorted(rows)])


def summed_statistics(replies: Sequence[Reply]) -> HttpAnswer:
    """``GET /v2/models[/{name}]/stats``: each model version's figures summed over replicas.

    Counts and nanoseconds add up (Triton's statistics are cumulative); ``last_inference``
    is the latest; batch sizes are summed size by size.
    """
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for reply in _succeeded(replies):
        for row in _body(reply, dict).get("model_stats", []):
            key = (str(row["name"]), str(row["version"]))
            rows[key] = _add_rows(rows[key], row) if key in rows else row
    return _json(200, {"model_stats": [rows[key] for key in sorted(rows)]})


def labelled_metrics(replies: Sequence[Reply]) -> HttpAnswer:
    """``GET /metrics``: every replica's series, each labelled ``replica="<id>"``.

    One ``# HELP`` and ``# TYPE`` per family (the first replica's), then the family's series
    from every replica, so that the page stays valid Prometheus text. Values and timestamps
    are kept as the replicas wrote them.
    """
    families: dict[str, list[str]] = {}
    described: set[str] = set()  # the families whose header an earlier replica gave
    for reply in _succeeded(replies):
        label = f'replica="{_escaped(reply.replica)}"'
        family: list[str] | None = None
        seen: set[str] = set()
        for line in reply.answer.body.decode("utf-8").splitlines():
            if line.startswith("#"):
                words = line.split(maxsplit=3)
                if len(words) < 3 or words[1] not in ("HELP", "TYPE"):
                    continue  # a comment, part of no family
                family = families.setdefault(words[2], [])
                seen.add(words[2])
                if words[2] not in described:
                    family.append(line)
            elif line.strip():
                if family is None:
                    raise FanoutError(f"replica {reply.replica} wrote a series before its # TYPE")
                family.append(_labelled(line, label))
        described |= seen
    body = "\n".join(line for lines in families.values() for line in lines) + "\n"
    content_type = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
    return HttpAnswer(200, (content_type,), body.encode("utf-8"))


def _labelled(line: str, label: str) -> str:
    """A sample's line with ``label`` first among its labels."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1 :]
        return f"{line[:brace]}{{{label}{'' if rest.startswith('}') else ','}{rest}"
    return f"{line[:space]}{{{label}}}{line[space:]}"


def every_status(replies: Sequence[Reply]) -> HttpAnswer:
    """``GET /v2/corral/status[...]``: each replica's status document, named by replica."""
    documents = [
        {"replica": reply.replica, "status": _body(reply, dict)} for reply in _succeeded(replies)
    ]
    documents.sort(key=lambda document: str(document["replica"]))
    return _json(200, {"replicas": documents})


def _succeeded(replies: Sequence[Reply]) -> Iterable[Reply]:
    """The replies, all 200; the first that is not makes the request's error."""
    if not replies:
        raise FanoutError("no model replica is running")
    for reply in replies:
        if reply.answer.status != 200:
            raise _Passed(reply)
    return replies


class _Passed(FanoutError):
    """A replica's own error answer, given back to the client as it came (its status kept)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"replica {reply.replica}: {_error_text(reply.answer)}")
        self.reply = reply


def passed_answer(error: FanoutError) -> HttpAnswer | None:
    """The replica's own error answer ``error`` carries, or None when it carries none."""
    if isinstance(error, _Passed):
        reply = error.reply
        message = f"{_error_text(reply.answer)} (replica {reply.replica})"
        return _json(reply.answer.status, {"error": message}, reply.answer.headers)
    return None


def _body(reply: Reply, kind: Callable[..., Any]) -> Any:
    try:
        document = orjson.loads(reply.answer.body)
    except orjson.JSONDecodeError as exc:
        raise FanoutError(f"replica {reply.replica} answered with no JSON: {exc}") from None
    if not isinstance(document, kind):  # type: ignore[arg-type]
        raise FanoutError(f"replica {reply.replica} answered {type(document).__name__}")
    return document


def _rank(row: dict[str, Any]) -> int:
    return _STATE_ORDER.get(str(row.get("state", "")), -1)


def _add_rows(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    total = dict(left)
    total["last_inference"] = max(left["last_inference"], right["last_inference"])
    for field in ("inference_count", "execution_count"):
        total[field] = left[field] + right[field]
    total["inference_stats"] = {
        kind: _add_durations(figure, right["inference_stats"][kind])
        for kind, figure in left["inference_stats"].items()
    }
    sizes: dict[int, dict[str, Any]] = {b["batch_size"]: b for b in left["batch_stats"]}
    for batch in right["batch_stats"]:
        size = batch["batch_size"]
        if size in sizes:
            mine = sizes[size]
            sizes[size] = {
                "batch_size": size,
                "compute_infer": _add_durations(mine["compute_infer"], batch["compute_infer"]),
            }
        else:
            sizes[size] = batch
    total["batch_stats"] = [sizes[size] for size in sorted(sizes)]
    return total


def _add_durations(left: dict[str, int], right: dict[str, int]) -> dict[str, int]:
    return {"count": left["count"] + right["count"], "ns": left["ns"] + right["ns"]}


def _error_text(answer: HttpAnswer) -> str:
    try:
        document = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return answer.body.decode("utf-8", "replace")
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return str(document["error"])
    return answer.body.decode("utf-8", "replace")


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _json(status: int, document: object, headers: Headers = ()) -> HttpAnswer:
    kept = tuple(
        (key, value)
        for key, value in headers
        if key not in (b"content-type", b"content-length", REPLICA_HEADER)
    )
    return HttpAnswer(status, _JSON + kept, orjson.dumps(document))


# -- gRPC ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrpcReply:
    """One replica's answer to a gRPC call every replica was asked."""

    #: Ray's replica id (the answer's ``corral-replica`` trailing metadata).
    replica: str
    answer: GrpcAnswer

    @staticmethod
    def of(answer: GrpcAnswer) -> GrpcReply:
        """The reply ``answer`` is, named by its ``corral-replica`` trailing metadata."""
        tag = REPLICA_HEADER.decode()
        for key, value in answer.trailing_metadata:
            if key == tag:
                return GrpcReply(value if isinstance(value, str) else value.decode(), answer)
        raise FanoutError(f"a replica's answer ({answer.code.name}) does not name its replica")


def grpc_all_succeeded(replies: Sequence[GrpcReply]) -> GrpcAnswer:
    """A load's or unload's answer: the first replica's if each was OK, else a failure's."""
    _grpc_failure(replies)
    return _grpc_answer(replies[0].answer.body)


def grpc_merged_index(replies: Sequence[GrpcReply]) -> GrpcAnswer:
    """RepositoryIndex: each model version once, in its most advanced state (as HTTP's)."""
    rows: dict[tuple[str, str], pb.RepositoryIndexResponse.ModelIndex] = {}
    for reply in _grpc_failure(replies):
        for row in _message(reply, pb.RepositoryIndexResponse).models:
            key = (row.name, row.version)
            kept = rows.get(key)
            if kept is None or _STATE_ORDER.get(row.state, -1) > _STATE_ORDER.get(kept.state, -1):
                rows[key] = row
    merged = pb.RepositoryIndexResponse(models=[rows[key] for key in sorted(rows)])
    return _grpc_answer(merged.SerializeToString())


def grpc_summed_statistics(replies: Sequence[GrpcReply]) -> GrpcAnswer:
    """ModelStatistics: each model version's figures summed over replicas (as HTTP's)."""
    rows: dict[tuple[str, str], pb.ModelStatistics] = {}
    for reply in _grpc_failure(replies):
        for row in _message(reply, pb.ModelStatisticsResponse).model_stats:
            key = (row.name, row.version)
            if key in rows:
                _add_statistics(rows[key], row)
            else:
                rows[key] = row
    merged = pb.ModelStatisticsResponse(model_stats=[rows[key] for key in sorted(rows)])
    return _grpc_answer(merged.SerializeToString())


class GrpcFailed(FanoutError):
    """A replica's own error, to answer the call with (its code kept)."""

    def __init__(self, answer: GrpcAnswer) -> None:
        super().__init__(answer.details)
        self.answer = answer


def _grpc_failure(replies: Sequence[GrpcReply]) -> Sequence[GrpcReply]:
    """The replies, all OK; else raises :class:`GrpcFailed` with the first failure's answer."""
    if not replies:
        raise FanoutError("no model replica is running")
    failed = [reply for reply in replies if reply.answer.code is not grpc.StatusCode.OK]
    if failed:
        first = failed[0]
        succeeded = len(replies) - len(failed)
        details = (
            f"{first.answer.details} (replica {first.replica}; {succeeded} of {len(replies)} "
            "replicas succeeded)"
        )
        raise GrpcFailed(GrpcAnswer(first.answer.code, details, b""))
    return replies


def _message(reply: GrpcReply, kind: Any) -> Any:
    try:
        return kind.FromString(reply.answer.body)
    except DecodeError as exc:
        raise FanoutError(f"replica {reply.replica} answered what does not parse: {exc}") from None


def _add_statistics(total: pb.ModelStatistics, row: pb.ModelStatistics) -> None:
    total.last_inference = max(total.last_inference, row.last_inference)
    total.inference_count += row.inference_count
    total.execution_count += row.execution_count
    for field in pb.InferStatistics.DESCRIPTOR.fields:
        _add_duration(
            getattr(total.inference_stats, field.name), getattr(row.inference_stats, field.name)
        )
    # Copies: the messages of a repeated field must not be put back into it.
    sizes: dict[int, pb.InferBatchStatistics] = {}
    for batch in (*total.batch_stats, *row.batch_stats):
        mine = sizes.get(batch.batch_size)
        if mine is None:
            sizes[batch.batch_size] = mine = pb.InferBatchStatistics()
            mine.CopyFrom(batch)
            continue
        for part in ("compute_input", "compute_infer", "compute_output"):
            _add_duration(getattr(mine, part), getattr(batch, part))
    del total.batch_stats[:]
    total.batch_stats.extend(sizes[size] for size in sorted(sizes))


def _add_duration(total: pb.StatisticDuration, other: pb.StatisticDuration) -> None:
    total.count += other.count
    total.ns += other.ns


def _grpc_answer(body: bytes) -> GrpcAnswer:
    return GrpcAnswer(grpc.StatusCode.OK, "", body)
