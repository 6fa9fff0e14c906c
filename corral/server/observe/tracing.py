"""Tracing with OpenTelemetry: W3C trace context in, spans for requests, runs and loads out.

Off by default, and then nothing here imports OpenTelemetry and a request costs one
``is None`` check at each edge. With ``--trace-exporter otlp`` (or ``console``),
:func:`start_tracing` imports it (the ``otel`` extra) and each
inference request, over HTTP or gRPC, gets a server span, the child of the caller's
``traceparent`` (and ``tracestate``) when it sends one, with these children:

- ``corral.decode``: reading and decoding the request, from its arrival;
- ``corral.queue``: its wait in the model's queue, from the scheduler's own stamps;
- ``corral.run``: the model's run that answered it: one span per run, the child of the first
  sampled request of the batch and **linked to every request's span in the batch**;
- ``corral.encode``: encoding the answer (and compressing it).

A load of a model version (a reload's build too) is a ``corral.load`` span of its own trace.
The core never imports OpenTelemetry: the scheduler and the loader hand this module the
``time.monotonic()`` stamps they already keep (:mod:`corral._base.trace_hooks`), and the spans are
made afterwards with those times.

Example::

    tracing = start_tracing("otlp")   # None for "none"
    app = HttpApp(plane, tracing=tracing)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from corral import __version__
from corral._base import LoadRecord, RunRecord, install_hint

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

__all__ = [
    "EXPORTERS",
    "RequestTrace",
    "Tracing",
    "TracingUnavailable",
    "check_tracing",
    "start_tracing",
]

logger = logging.getLogger(__name__)

#: What ``--trace-exporter`` takes: none (off), otlp (OTLP over HTTP), console (stdout).
Exporter = Literal["none", "otlp", "console"]
EXPORTERS: tuple[Exporter, ...] = ("none", "otlp", "console")
#: The service name spans carry unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES give one.
SERVICE_NAME = "corral"

# The W3C Trace Context headers, as ASGI spells them.
_TRACE_HEADERS = (b"traceparent", b"tracestate")
# The longest refused traceparent kept in a span's attribute.
_MAX_REFUSED_CHARS = 128


class TracingUnavailable(Exception):
    """Tracing was asked for and cannot run: the extra is missing, or the SDK is disabled."""


def check_tracing(exporter: Exporter) -> None:
    """Raise :class:`TracingUnavailable` if ``exporter`` cannot run here; import nothing for none.

    For ``corral serve``, before it starts anything: a missing ``otel`` extra names the
    ``pip install`` that fixes it; ``OTEL_SDK_DISABLED=true`` (which would make every span a
    no-op) is refused rather than tracing nothing.
    """
    if exporter == "none":
        return
    try:
        import opentelemetry.sdk.trace
        import opentelemetry.trace

        if exporter == "otlp":
            import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            f"--trace-exporter {exporter} needs OpenTelemetry ({exc}); install it with: "
            f"{install_hint('otel')}"
        ) from exc
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        raise TracingUnavailable(
            f"--trace-exporter {exporter} asks for tracing, but OTEL_SDK_DISABLED=true turns "
            "OpenTelemetry's SDK off: unset one of them"
        )


def start_tracing(exporter: Exporter) -> Tracing | None:
    """The server's tracing with ``exporter``'s spans; None (and nothing imported) for none.

    ``otlp`` sends spans in batches by OTLP over HTTP, configured by OpenTelemetry's own
    variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
    ``..._HEADERS``, ``..._TIMEOUT``, ``OTEL_BSP_*``); ``console`` writes each span as JSON
    to stdout. Sampling follows ``OTEL_TRACES_SAMPLER`` (default: parent-based, always on),
    the resource ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (service name
    ``corral`` unless they give one). Raises :class:`TracingUnavailable` as
    :func:`check_tracing` does.
    """
    if exporter == "none":
        return None
    check_tracing(exporter)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    return Tracing(provider)


class Tracing:
    """Makes the server's spans: one :class:`RequestTrace` per request, and load spans.

    Thread-safe: requests start on the event loop, runs are recorded on compute workers and
    loads on load workers; OpenTelemetry's SDK takes its own locks. :meth:`shutdown` flushes
    what the exporter has not sent yet, and is idempotent.
    """

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        self._tracer = provider.get_tracer("corral", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._api = trace

    @property
    def provider(self) -> TracerProvider:
        """The OpenTelemetry tracer provider the spans are made by."""
        return self._provider

    def http_request(
        self, method: str, route: str, headers: Iterable[tuple[bytes, bytes]], model: str
    ) -> RequestTrace:
        """Start the span of an HTTP request, under the caller's ``traceparent`` header if any."""
        carrier = _carrier(
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in headers
            if key in _TRACE_HEADERS  # ASGI's header names are lower case
        )
        attributes = {"http.request.method": method, "http.route": route, "corral.model": model}
        return self._request(f"{method} {route}", carrier, attributes)

    def grpc_request(
        self, service: str, method: str, metadata: Iterable[tuple[str, Any]] | None, model: str
    ) -> RequestTrace:
        """Start the span of a gRPC call, under the caller's ``traceparent`` metadata if any."""
        carrier = _carrier((key, value) for key, value in metadata or () if isinstance(value, str))
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": method,
            "corral.model": model,
        }
        return self._request(f"{service}/{method}", carrier, attributes)

    def _request(
        self, name: str, carrier: dict[str, str], attributes: dict[str, Any]
    ) -> RequestTrace:
        started = time.time_ns()
        parent = self._propagator.extract(carrier) if carrier else None
        if "traceparent" in carrier:
            assert parent is not None
            if not self._api.get_current_span(parent).get_span_context().is_valid:
                # W3C Trace Context: a traceparent that does not parse starts a new trace. It
                # is kept on the span, so that the caller's mistake can be found.
                refused = carrier["traceparent"][:_MAX_REFUSED_CHARS]
                attributes["corral.traceparent.refused"] = refused
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=self._api.SpanKind.SERVER,
            attributes=attributes,
            start_time=started,
        )
        return RequestTrace(self, span, started)

    def load_done(self, record: LoadRecord) -> None:
        """The Host's load observer: a ``corral.load`` span for one load of a version."""
        offset = _monotonic_to_epoch_ns()
        span = self._tracer.start_span(
            "corral.load",
            context=self._api.set_span_in_context(self._api.INVALID_SPAN),  # a trace of its own
            attributes={
                "corral.model": record.model,
                "corral.version": record.version,
                "corral.status": _status_name(record.error),
            },
            start_time=_epoch_ns(record.started, offset),
        )
        if record.size_bytes is not None:
            span.set_attribute("corral.size_bytes", record.size_bytes)
        if record.error is not None:
            _fail(self._api, span, record.error)
        span.end(_epoch_ns(record.ended, offset))

    def context_of(self, span: Span) -> Context:
        """A context whose current span is ``span``: the parent of its children."""
        return self._api.set_span_in_context(span)

    def shutdown(self) -> None:
        """Send the spans not yet exported and stop the exporter; blocking, idempotent."""
        self._provider.shutdown()


class RequestTrace:
    """One traced request: its server span and the children it gets as it goes.

    Made by :class:`Tracing` on the event loop; the scheduler calls :meth:`ran` on a compute
    worker (it is a :class:`~corral._base.trace_hooks.RunTrace`). A request the sampler dropped
    gets no child spans (they would be dropped too): it costs its span and nothing more.
    """

    __slots__ = ("_encoding", "_started", "_tracing", "recording", "span")

    def __init__(self, tracing: Tracing, span: Span, started_ns: int) -> None:
        self._tracing = tracing
        #: The request's server span, and whether it is sampled (recorded and exported).
        self.span = span
        self.recording = span.is_recording()
        self._started = started_ns
        self._encoding = 0

    def decoded(self) -> None:
        """The request is read and decoded: its ``corral.decode`` span, from its arrival."""
        if self.recording:
            self._child("corral.decode", self._started, time.time_ns())

    def encoding(self) -> None:
        """The answer is about to be encoded."""
        if self.recording:
            self._encoding = time.time_ns()

    def encoded(self) -> None:
        """The answer is encoded (and compressed): its ``corral.encode`` span."""
        if self.recording:
            self._child("corral.encode", self._encoding, time.time_ns())

    def ran(self, run: RunRecord) -> None:
        """A ``corral.run`` span for ``run``, linked to each request's; their queue spans.

        Nothing when no request of the run is sampled.
        """
        tracing = self._tracing
        api = tracing._api
        offset = _monotonic_to_epoch_ns()
        started = _epoch_ns(run.started, offset)
        links = []
        parent: Span | None = None
        for trace, enqueued, error in run.requests:
            assert isinstance(trace, RequestTrace)  # the only RunTrace the server makes
            span = trace.span
            links.append(api.Link(span.get_span_context()))
            if not trace.recording:
                continue
            if parent is None:
                parent = span
            span.set_attribute("corral.version", run.version)
            queued = tracing._tracer.start_span(
                "corral.queue",
                context=tracing.context_of(span),
                attributes={"corral.status": _status_name(error)},
                start_time=_epoch_ns(enqueued, offset),
            )
            queued.end(started)
        if parent is None:
            return
        errors = [error for _, _, error in run.requests if error is not None]
        span = tracing._tracer.start_span(
            "corral.run",
            context=tracing.context_of(parent),
            attributes={
                "corral.model": run.model,
                "corral.version": run.version,
                "corral.rows": run.rows,
                "corral.batch_size": run.batch_size,
                "corral.runs": run.runs,
                "corral.status": _status_name(errors[0] if errors else None),
            },
            links=links,
            start_time=started,
        )
        if errors and len(errors) == len(run.requests):
            _fail(api, span, errors[0])  # the run failed them all; else some were answered
        span.end(_epoch_ns(run.ended, offset))

    def finish(self, error: BaseException | None, attribute: str, code: int | str | None) -> None:
        """End the request's span; ``code``: the transport's status, set as ``attribute``."""
        span = self.span
        if not self.recording:
            span.end()  # dropped by the sampler: its attributes would be dropped too
            return
        if code is not None:
            span.set_attribute(attribute, code)
        span.set_attribute("corral.status", _status_name(error))
        if error is not None:
            _fail(self._tracing._api, span, error)
        span.end()

    def _child(self, name: str, start_ns: int, end_ns: int) -> None:
        tracing = self._tracing
        child = tracing._tracer.start_span(
            name, context=tracing.context_of(self.span), start_time=start_ns
        )
        child.end(end_ns)


def _carrier(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The W3C trace context headers among ``pairs``; several tracestate lines join."""
    carrier: dict[str, str] = {}
    for key, value in pairs:
        key = key.lower()
        if key == "traceparent":
            carrier[key] = value
        elif key == "tracestate":
            carrier[key] = f"{carrier[key]},{value}" if key in carrier else value
    return carrier


def _status_name(error: BaseException | None) -> str:
    return "OK" if error is None else type(error).__name__


def _fail(api: Any, span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(api.Status(api.StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _monotonic_to_epoch_ns() -> int:
    """What to add to ``time.monotonic()`` nanoseconds to get the epoch's: taken now."""
    return time.time_ns() - time.monotonic_ns()


def _epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns
