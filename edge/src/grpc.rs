//! gRPC (HTTP/2, hyper's server): the connection limits of `corral/server/grpc_limits.py`,
//! the native ModelInfer for plain requests, and the bridge (hyper's HTTP/2 client to the
//! Python grpc.aio server on a Unix socket) for every other call, streaming both ways.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::pace::{slow_text, Pace};
use crate::pings::PingPolice;
use crate::plain::{element_count, DataType, PlainRequest, Storage, Tensor};
use crate::shared::{Answer, CatchUnwind, GrpcPlace, Held, Pending, Protocol, Shared, Stats, INFO};

/// The messages generated from `proto/grpc_service.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const UNAVAILABLE: u32 = 14;
const INTERNAL: u32 = 13;
const RESOURCE_EXHAUSTED: u32 = 8;
const DEADLINE_EXCEEDED: u32 = 4;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// -- the plain check ----------------------------------------------------------------------

/// A plain ModelInfer, decoded.
#[derive(Debug)]
pub struct PlainCall {
    pub model: String,
    pub version: Option<String>,
    pub request: PlainRequest,
}

/// Decodes a ModelInferRequest when it is plain (as `grpc_codec._decode_plain` takes it,
/// and narrower): no request parameters but one that changes no answer
/// ([`answer_unchanged`]), each input a fixed-size numeric tensor with no
/// parameters or typed contents, one `raw_input_contents` entry each of its exact size,
/// requested outputs by name only. None: the bridge.
pub fn decode_plain(message: Bytes) -> Option<PlainCall> {
    let request = pb::ModelInferRequest::decode(message).ok()?;
    if !request
        .parameters
        .iter()
        .all(|(key, value)| answer_unchanged(key, value))
        || request.raw_input_contents.is_empty()
        || request.raw_input_contents.len() != request.inputs.len()
    {
        return None;
    }
    let mut outputs = Vec::with_capacity(request.outputs.len());
    for output in request.outputs {
        if !output.parameters.is_empty() {
            return None;
        }
        outputs.push((output.name, None));
    }
    let mut inputs: Vec<Tensor> = Vec::with_capacity(request.inputs.len());
    for (tensor, raw) in request.inputs.into_iter().zip(request.raw_input_contents) {
        if !tensor.parameters.is_empty() || tensor.contents.is_some() {
            return None;
        }
        if inputs.iter().any(|other| other.name == tensor.name) {
            return None;
        }
        let datatype = DataType::parse(tensor.datatype.as_bytes())?;
        let mut shape = Vec::with_capacity(tensor.shape.len());
        for dim in tensor.shape {
            shape.push(u64::try_from(dim).ok()?);
        }
        let count = element_count(&shape, datatype.itemsize())?;
        if count.checked_mul(datatype.itemsize() as u64)? != raw.len() as u64 {
            return None;
        }
        inputs.push(Tensor {
            name: tensor.name,
            datatype,
            shape,
            data: Storage::from_body(raw, datatype.itemsize()),
        });
    }
    Some(PlainCall {
        model: request.model_name,
        version: (!request.model_version.is_empty()).then_some(request.model_version),
        request: PlainRequest {
            id: (!request.id.is_empty()).then_some(request.id),
            inputs,
            outputs,
            binary_data_output: false,
        },
    })
}

/// Whether a request parameter leaves the answer as it would be without it:
/// `triton_enable_empty_final_response` (perf_analyzer sends it), which asks a decoupled model
/// to mark its last response; corral's models are not decoupled, so the one response is the
/// final one whatever its value, as `corral.protocol.parameters` takes it.
fn answer_unchanged(key: &str, value: &pb::InferParameter) -> bool {
    key == "triton_enable_empty_final_response"
        && matches!(
            value.parameter_choice,
            Some(pb::infer_parameter::ParameterChoice::BoolParam(_))
        )
}

/// The `grpc-timeout` header in microseconds.
pub fn timeout_us(value: &[u8]) -> Option<u64> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => amount * 3_600_000_000,
        b'M' => amount * 60_000_000,
        b'S' => amount * 1_000_000,
        b'm' => amount * 1_000,
        b'u' => amount,
        b'n' => amount / 1_000,
        _ => return None,
    })
}

// -- response bodies ------------------------------------------------------------------------

/// Counts a stream open on its connection until its answer's body is dropped.
struct StreamGuard(Arc<GrpcPlace>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
        *self.0.last_change.lock() = Instant::now();
    }
}

/// An answer's body: made here (data then trailers), or relayed from the bridge.
pub struct GrpcBody {
    kind: Kind,
    _guard: Option<StreamGuard>,
}

enum Kind {
    Full {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    Relay(Incoming),
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Full { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Kind::Relay(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Relay(incoming) => incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Relay(incoming) => incoming.size_hint(),
        }
    }
}

/// gRPC's percent-encoding of grpc-message.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn status_response(code: u32, message: &str, guard: Option<StreamGuard>) -> Response<GrpcBody> {
    let mut response = Response::new(GrpcBody {
        kind: Kind::Full {
            data: None,
            trailers: None,
        },
        _guard: guard,
    });
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

fn message_response(message: Vec<u8>, guard: Option<StreamGuard>) -> Response<GrpcBody> {
    let mut data = BytesMut::with_capacity(message.len() + 5);
    data.extend_from_slice(&[0]);
    data.extend_from_slice(&(message.len() as u32).to_be_bytes());
    data.extend_from_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(GrpcBody {
        kind: Kind::Full {
            data: Some(data.freeze()),
            trailers: Some(trailers),
        },
        _guard: guard,
    });
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

// -- the bridge -----------------------------------------------------------------------------

/// A bridged request's body: what the edge read of it already, then the rest.
pub struct Forwarded {
    prefix: Option<Bytes>,
    trailers: Option<HeaderMap>,
    rest: Option<Incoming>,
}

impl Body for Forwarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if let Some(rest) = self.rest.as_mut() {
            match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(None) => self.rest = None,
                other => return other.map_err(|e| Box::new(e) as BoxError),
            }
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_none() && self.trailers.is_none()
    }
}

/// The HTTP/2 client connection to the Python gRPC server, made again when it closes.
pub struct Bridge {
    path: Option<String>,
    sender: tokio::sync::Mutex<Option<hyper::client::conn::http2::SendRequest<Forwarded>>>,
}

impl Bridge {
    fn new(path: Option<String>) -> Self {
        Self {
            path,
            sender: tokio::sync::Mutex::new(None),
        }
    }

    async fn sender(&self) -> Result<hyper::client::conn::http2::SendRequest<Forwarded>, String> {
        let Some(path) = self.path.as_deref() else {
            return Err(
                "this call is not served by the native edge, and no gRPC bridge to the \
                        Python edge is configured (grpc_bridge)"
                    .to_string(),
            );
        };
        let mut slot = self.sender.lock().await;
        if let Some(sender) = slot.as_ref() {
            if !sender.is_closed() {
                return Ok(sender.clone());
            }
        }
        let unreachable = |error: &dyn std::fmt::Display| {
            format!("the Python edge's gRPC bridge at {path} cannot be reached: {error}")
        };
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| unreachable(&e))?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(4 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        *slot = Some(sender.clone());
        Ok(sender)
    }

    async fn forward(
        &self,
        parts: http::request::Parts,
        body: Forwarded,
        peer: std::net::SocketAddr,
    ) -> Result<Response<Incoming>, String> {
        let mut sender = self.sender().await?;
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = parts.uri.authority().map_or("localhost", |a| a.as_str());
        let mut request = Request::new(body);
        *request.method_mut() = parts.method;
        *request.uri_mut() = format!("http://{authority}{path}")
            .parse()
            .map_err(|e| format!("the call's path cannot be forwarded: {e}"))?;
        *request.headers_mut() = parts.headers;
        request.headers_mut().remove("x-corral-peer");
        if let Ok(value) = HeaderValue::from_str(&peer.to_string()) {
            request.headers_mut().insert("x-corral-peer", value);
        }
        sender
            .ready()
            .await
            .map_err(|e| format!("the Python edge's gRPC bridge failed: {e}"))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("the Python edge's gRPC bridge failed: {e}"))
    }
}

// -- connections ------------------------------------------------------------------------------

/// The connection as hyper sees it: the first bytes read (the preface) given back before the
/// rest of the stream, and the bytes both ways watched by the ping policy.
struct Rewind {
    prefix: Option<Bytes>,
    inner: TcpStream,
    police: PingPolice,
    /// The client pinged too often: its GOAWAY was sent (when it could be), and the
    /// connection reads as ended and takes no more writes.
    ended: bool,
}

impl Rewind {
    fn new(prefix: Bytes, inner: TcpStream, min_ping_interval: Duration) -> Self {
        Self {
            prefix: Some(prefix),
            inner,
            police: PingPolice::new(min_ping_interval),
            ended: false,
        }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(())); // the end of the stream
        }
        if let Some(mut prefix) = self.prefix.take() {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix.split_to(n));
            if !prefix.is_empty() {
                self.prefix = Some(prefix);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) {
            let this = &mut *self;
            if this
                .police
                .received(&buf.filled()[before..], Instant::now())
            {
                // Too many pings: hyper gets none of these bytes but the end of the stream,
                // and the client the GOAWAY grpc core would send (if the server's bytes are
                // between frames; a write cut mid-frame leaves only the close).
                buf.set_filled(before);
                this.ended = true;
                if let Some(goaway) = this.police.goaway() {
                    let _ = this.inner.try_write(&goaway);
                }
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.police.sent(&buf[..n]);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = polled {
            for slice in bufs {
                let taken = n.min(slice.len());
                self.police.sent(&slice[..taken]);
                n -= taken;
                if n == 0 {
                    break;
                }
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Counts an open gRPC connection, and keeps its place, until its task ends, however it ends.
struct Open(Arc<Shared>, u64);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.grpc_places.lock().retain(|(id, _)| *id != self.1);
        self.0.grpc_open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many connections past the cap may be open while those asked for room close: a burst
/// of new connections cannot take more descriptors than the cap and this.
fn room_slack(max: usize) -> usize {
    (max / 8).max(1)
}

/// At the cap, asks the oldest idle connection (no call in flight, not asked before) to close
/// for a new one, one that never made a call before one that did (a client between two calls
/// is idle too, and a burst of fresh idle connections would otherwise be newer than it), as the HTTP side closes an idle connection at its cap: a handful of idle
/// clients cannot keep new ones out. False when every connection has a call in flight (or
/// was asked already): the new one is then closed at once.
///
/// The new connection is admitted at once; the asked one sends GOAWAY and closes within
/// `ROOM_GRACE` unless a call opened on it meanwhile, so the connections open pass the cap
/// by at most those closing, and never by more than `room_slack`.
fn make_room(shared: &Shared) -> bool {
    let places = shared.grpc_places.lock();
    let victim = places
        .iter()
        .filter(|(_, place)| {
            place.active.load(Ordering::SeqCst) == 0 && !place.room_asked.load(Ordering::SeqCst)
        })
        .min_by_key(|(_, place)| {
            (
                place.called.load(Ordering::SeqCst),
                *place.last_change.lock(),
            )
        });
    let Some((_, victim)) = victim else {
        return false;
    };
    victim.room_asked.store(true, Ordering::SeqCst);
    victim.close_for_room.notify_one();
    true
}

/// Accepts gRPC connections until the drain (or the stop) begins.
pub async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let bridge = Arc::new(Bridge::new(shared.config.grpc_bridge.clone()));
    let mut next_id: u64 = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.draining.wait() => break,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if let Some(max) = shared.config.grpc_max_connections {
            let open = shared.grpc_open.load(Ordering::SeqCst);
            if open >= max && (open >= max + room_slack(max) || !make_room(&shared)) {
                drop(stream); // closed at once, as grpc core does past its cap
                continue;
            }
        }
        shared.grpc_open.fetch_add(1, Ordering::SeqCst);
        Stats::add(&shared.stats.grpc_accepted, 1);
        let id = next_id;
        next_id += 1;
        let place = Arc::new(GrpcPlace::new(Instant::now()));
        shared.grpc_places.lock().push((id, Arc::clone(&place)));
        let shared = Arc::clone(&shared);
        let bridge = Arc::clone(&bridge);
        tokio::spawn(async move {
            let _open = Open(Arc::clone(&shared), id);
            let stopping = Arc::clone(&shared);
            tokio::select! {
                () = serve(stream, peer, Arc::clone(&shared), bridge, place) => {}
                () = stopping.stopping.wait() => {}
            }
        });
    }
}

async fn serve(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    shared: Arc<Shared>,
    bridge: Arc<Bridge>,
    state: Arc<GrpcPlace>,
) {
    let _ = stream.set_nodelay(true);
    let config = &shared.config;
    // The handshake: the client's preface within grpc_handshake_timeout of the accept. A
    // connection asked to close for room before it is done has no call: it just closes.
    let mut preface = vec![0u8; PREFACE.len()];
    tokio::select! {
        read = tokio::time::timeout(config.grpc_handshake_timeout, stream.read_exact(&mut preface)) => {
            match read {
                Ok(Ok(_)) if preface == PREFACE => {}
                _ => return,
            }
        }
        () = state.close_for_room.notified() => return,
    }
    let io = TokioIo::new(Rewind::new(
        Bytes::from(preface),
        stream,
        config.grpc_min_ping_interval,
    ));
    let service = {
        let state = Arc::clone(&state);
        let shared = Arc::clone(&shared);
        hyper::service::service_fn(move |request: Request<Incoming>| {
            state.active.fetch_add(1, Ordering::SeqCst);
            state.called.store(true, Ordering::SeqCst);
            let guard = StreamGuard(Arc::clone(&state));
            let shared = Arc::clone(&shared);
            let bridge = Arc::clone(&bridge);
            async move {
                let stats = Arc::clone(&shared);
                let handled =
                    CatchUnwind(Box::pin(handle(request, shared, bridge, peer, guard))).await;
                Ok::<_, Infallible>(handled.unwrap_or_else(|_| {
                    Stats::add(&stats.stats.panics, 1);
                    status_response(
                        INTERNAL,
                        "internal error: the edge failed on this call",
                        None,
                    )
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(config.grpc_keepalive_time)
        .keep_alive_timeout(config.grpc_keepalive_timeout)
        .max_concurrent_streams(config.grpc_max_concurrent_streams)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        .max_send_buf_size(4 << 20);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let idle = config.grpc_idle_timeout;
    let mut shutting = false;
    let mut check_at = Instant::now() + idle;
    // Set once an idle connection was sent its GOAWAY: it is closed then, if no call opened.
    let mut idle_close: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            () = tokio::time::sleep_until(check_at.into()), if !shutting => {
                let last_change = *state.last_change.lock();
                if state.active.load(Ordering::SeqCst) > 0 {
                    check_at = Instant::now() + idle; // a call is open: not idle
                } else if last_change.elapsed() >= idle {
                    // No call for idle_timeout: GOAWAY, as grpc core's max_connection_idle.
                    connection.as_mut().graceful_shutdown();
                    shutting = true;
                    idle_close = Some(Instant::now() + IDLE_GOAWAY_GRACE);
                } else {
                    check_at = last_change + idle;
                }
            }
            () = state.close_for_room.notified(), if !shutting => {
                // Asked for room at the cap: GOAWAY, and closed soon unless a call came in
                // meanwhile (then it closes once its calls end, as a drained connection).
                connection.as_mut().graceful_shutdown();
                shutting = true;
                idle_close = Some(Instant::now() + ROOM_GRACE);
            }
            () = sleep_until_some(idle_close) => {
                // hyper's graceful close waits for the client's answer to a PING; a client
                // that says nothing (a dead peer, a raw socket) would hold the connection.
                if state.active.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle_close = Some(Instant::now() + IDLE_GOAWAY_GRACE);
            }
            () = shared.draining.wait(), if !shutting => {
                connection.as_mut().graceful_shutdown();
                shutting = true;
            }
        }
    }
}

/// How long an idle connection sent its GOAWAY may take to close before the edge closes it.
const IDLE_GOAWAY_GRACE: Duration = Duration::from_secs(5);
/// The same for a connection closed to make room at the cap: short, as the room is wanted now.
const ROOM_GRACE: Duration = Duration::from_millis(500);

/// Completes at `at`; never when `at` is None.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Whether a call's headers let it take the native route.
fn native_headers(request: &Request<Incoming>, shared: &Shared) -> bool {
    let config = &shared.config;
    if !config.native_infer || request.uri().path() != MODEL_INFER {
        return false;
    }
    let headers = request.headers();
    let grpc_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    if !grpc_type || headers.contains_key("x-request-id") {
        return false;
    }
    if headers
        .get("grpc-encoding")
        .is_some_and(|v| v.as_bytes() != b"identity")
    {
        return false;
    }
    match &config.auth {
        None => true,
        Some(accepted) => headers
            .get_all("authorization")
            .iter()
            .any(|v| crate::hosts::one_of(v.as_bytes(), accepted)),
    }
}

/// What a native candidate's body read gave.
enum Read {
    /// The whole message as it came (flag 0, its 5-byte prefix kept) and nothing after it.
    Message(Bytes, Held),
    /// Not for the native route: these bytes (and trailers) were read, the rest follows.
    Bridge(Bytes, Option<HeaderMap>, Option<Incoming>),
    /// Refused with this status.
    Refuse(u32, String),
}

async fn read_message(mut body: Incoming, shared: &Shared) -> Read {
    use frames::next_frame;
    // A Vec, not a BytesMut: once the prefix gives the message's length, its room is taken
    // in one fallible reservation (no doubling that leaves freed copies in the allocator's
    // arenas, no abort where the system cannot commit it), and it becomes Bytes unchanged.
    let mut collected: Vec<u8> = Vec::new();
    let mut held = Held::new(Arc::clone(&shared.budget));
    let mut kept = true;
    let mut expected: Option<usize> = None;
    // The message is held to the HTTP body's progress rules: trickled, it would hold what it
    // sent of the budget for as long as it kept trickling.
    let mut pace = Pace::new(&shared.config, Instant::now());
    loop {
        let next = tokio::time::timeout_at(pace.deadline().into(), next_frame(&mut body)).await;
        let frame = match next {
            Err(_) => match pace.check(Instant::now()) {
                Ok(()) => continue,
                Err(slow) => {
                    let text = slow_text(&slow, &shared.config);
                    shared.say(INFO, format!("{text}; answered DEADLINE_EXCEEDED"));
                    return Read::Refuse(DEADLINE_EXCEEDED, text);
                }
            },
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(_))) => {
                return Read::Refuse(INTERNAL, "the call's stream broke".to_string())
            }
        };
        match frame.into_data() {
            Ok(data) => {
                pace.arrived(data.len(), Instant::now());
                if kept && !held.grow(data.len()) {
                    kept = false;
                }
                collected.extend_from_slice(&data);
                if expected.is_none() && collected.len() >= 5 {
                    let length = u32::from_be_bytes([
                        collected[1],
                        collected[2],
                        collected[3],
                        collected[4],
                    ]) as usize;
                    let max = shared.config.grpc_max_message_bytes;
                    if length > max {
                        return Read::Refuse(
                            RESOURCE_EXHAUSTED,
                            format!(
                                "Received message larger than max ({length} vs. {max}) \
                                 (grpc_max_message_bytes)"
                            ),
                        );
                    }
                    if collected[0] != 0 {
                        return Read::Bridge(Bytes::from(collected), None, Some(body));
                    }
                    expected = Some(length + 5);
                    let room = (length + 5).saturating_sub(collected.len());
                    if collected.try_reserve_exact(room).is_err() {
                        return Read::Refuse(
                            RESOURCE_EXHAUSTED,
                            format!("the server cannot hold a message of {length} bytes now"),
                        );
                    }
                }
                if expected.is_some_and(|e| collected.len() > e) || !kept {
                    return Read::Bridge(Bytes::from(collected), None, Some(body));
                }
            }
            Err(frame) => {
                // Trailers from the client: unusual; the bridge carries them.
                let trailers = frame.into_trailers().ok();
                return Read::Bridge(Bytes::from(collected), trailers, None);
            }
        }
    }
    match expected {
        Some(length) if collected.len() == length => Read::Message(Bytes::from(collected), held),
        _ => Read::Bridge(Bytes::from(collected), None, None),
    }
}

/// The next frame of a body (what http-body-util's `BodyExt::frame` does, without the crate).
mod frames {
    use super::*;

    pub async fn next_frame(body: &mut Incoming) -> Option<Result<Frame<Bytes>, hyper::Error>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    bridge: Arc<Bridge>,
    peer: std::net::SocketAddr,
    guard: StreamGuard,
) -> Response<GrpcBody> {
    let received = Instant::now();
    if !native_headers(&request, &shared) {
        let (parts, body) = request.into_parts();
        return relay(
            &shared,
            &bridge,
            parts,
            Forwarded {
                prefix: None,
                trailers: None,
                rest: Some(body),
            },
            peer,
            guard,
        )
        .await;
    }
    let timeout = request
        .headers()
        .get("grpc-timeout")
        .and_then(|v| timeout_us(v.as_bytes()));
    let (parts, body) = request.into_parts();
    // The message as it came, prefix and all: the bridge forwards this one buffer, so the
    // edge never holds a second copy of a large message while Python reads it.
    let (framed, held) = match read_message(body, &shared).await {
        Read::Message(framed, held) => (framed, held),
        Read::Refuse(code, text) => return status_response(code, &text, Some(guard)),
        Read::Bridge(prefix, trailers, rest) => {
            let body = Forwarded {
                prefix: Some(prefix),
                trailers,
                rest,
            };
            return relay(&shared, &bridge, parts, body, peer, guard).await;
        }
    };
    let Some(call) = decode_plain(framed.slice(5..)) else {
        drop(held);
        return relay(&shared, &bridge, parts, whole(framed), peer, guard).await;
    };
    shared.maybe_panic(&call.model);
    let (reply, answer) = tokio::sync::oneshot::channel();
    let pending = Pending {
        model: call.model,
        version: call.version,
        protocol: Protocol::Grpc,
        request: call.request,
        timeout_us: timeout,
        received,
        reply,
        held,
    };
    if shared.queue.push(pending).is_err() {
        Stats::add(&shared.stats.refused_pending, 1);
        let message = format!(
            "the server has {} requests waiting for Python, its limit (max_pending); try again later",
            shared.queue.limit()
        );
        return status_response(RESOURCE_EXHAUSTED, &message, Some(guard));
    }
    Stats::add(&shared.stats.native, 1);
    let answered = tokio::select! {
        answer = answer => answer.ok(),
        () = shared.cut.wait() => None,
    };
    match answered {
        Some(Answer::Grpc {
            code: 0,
            body: Some(body),
            ..
        }) => message_response(body, Some(guard)),
        Some(Answer::Grpc { code, message, .. }) => status_response(code, &message, Some(guard)),
        Some(Answer::Http { .. }) => {
            status_response(INTERNAL, "an HTTP answer to a gRPC call", Some(guard))
        }
        // Python sends it the general way: the message as it came, to its gRPC server.
        Some(Answer::Bridge) => relay(&shared, &bridge, parts, whole(framed), peer, guard).await,
        None => {
            Stats::add(&shared.stats.cut, 1);
            status_response(
                UNAVAILABLE,
                "the server is shutting down and its drain timeout ran out",
                Some(guard),
            )
        }
    }
}

/// A message read whole, as it came (uncompressed, its prefix kept), for the bridge.
fn whole(framed: Bytes) -> Forwarded {
    Forwarded {
        prefix: Some(framed),
        trailers: None,
        rest: None,
    }
}

async fn relay(
    shared: &Shared,
    bridge: &Bridge,
    parts: http::request::Parts,
    body: Forwarded,
    peer: std::net::SocketAddr,
    guard: StreamGuard,
) -> Response<GrpcBody> {
    Stats::add(&shared.stats.bridged, 1);
    let forwarded = tokio::select! {
        forwarded = bridge.forward(parts, body, peer) => forwarded,
        () = shared.cut.wait() => {
            Stats::add(&shared.stats.cut, 1);
            return status_response(UNAVAILABLE, "the server is shutting down and its drain timeout ran out", Some(guard));
        }
    };
    match forwarded {
        Ok(response) => {
            let (parts, incoming) = response.into_parts();
            Response::from_parts(
                parts,
                GrpcBody {
                    kind: Kind::Relay(incoming),
                    _guard: Some(guard),
                },
            )
        }
        Err(message) => status_response(UNAVAILABLE, &message, Some(guard)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::Config;

    #[test]
    fn room_is_made_by_the_oldest_idle_connection_only() {
        let shared = Shared::new(Config::default(), Arc::new(crate::shared::Budget::new(1)));
        let start = Instant::now();
        let place = |id: u64, ago_ms: u64, calls: usize| {
            let place = Arc::new(GrpcPlace::new(start - Duration::from_millis(ago_ms)));
            place.active.store(calls, Ordering::SeqCst);
            shared.grpc_places.lock().push((id, Arc::clone(&place)));
            place
        };
        let busy_oldest = place(0, 900, 1);
        let called_oldest = place(3, 800, 0);
        called_oldest.called.store(true, Ordering::SeqCst);
        let idle_old = place(1, 500, 0);
        let idle_new = place(2, 100, 0);
        assert!(make_room(&shared));
        assert!(idle_old.room_asked.load(Ordering::SeqCst));
        assert!(!busy_oldest.room_asked.load(Ordering::SeqCst));
        assert!(!idle_new.room_asked.load(Ordering::SeqCst));
        // Asked once: the next one asked is the newer idle one, then the one that made
        // calls (older than both), then none is left.
        assert!(make_room(&shared));
        assert!(idle_new.room_asked.load(Ordering::SeqCst));
        assert!(!called_oldest.room_asked.load(Ordering::SeqCst));
        assert!(make_room(&shared));
        assert!(called_oldest.room_asked.load(Ordering::SeqCst));
        assert!(!make_room(&shared));
        assert!(!busy_oldest.room_asked.load(Ordering::SeqCst));
        assert_eq!(room_slack(4), 1);
        assert_eq!(room_slack(192), 24);
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout_us(b"5S"), Some(5_000_000));
        assert_eq!(timeout_us(b"100m"), Some(100_000));
        assert_eq!(timeout_us(b"123456789S"), None);
        assert_eq!(timeout_us(b"S"), None);
    }

    #[test]
    fn plain_calls() {
        let request = pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "X".into(),
                datatype: "FP32".into(),
                shape: vec![1, 2],
                ..Default::default()
            }],
            raw_input_contents: vec![Bytes::from_static(&[0; 8])],
            ..Default::default()
        };
        let call = decode_plain(Bytes::from(request.encode_to_vec()));
        assert!(call.is_some_and(|c| c.model == "m" && c.request.inputs.len() == 1));
        let mut wrong = request.clone();
        wrong.raw_input_contents = vec![Bytes::from_static(&[0; 4])];
        assert!(decode_plain(Bytes::from(wrong.encode_to_vec())).is_none());
    }
}
