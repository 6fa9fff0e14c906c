//! HTTP/1.1 connections: the Python edge's limits (`corral/server/_uvicorn.py`'s
//! `EdgeProtocol`, same statuses and texts), the native route for plain inference requests,
//! and the bridge for everything else.
//!
//! One task per connection, one request at a time: a pipelined request waits in the buffer
//! until the one before it is answered, so answers go out in order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout_at;

use crate::bridge::{self, BodySource};
use crate::chunked::Chunked;
use crate::encode::http_refusal;
use crate::head::{parse_head, Head, Parsed};
use crate::pace::{slow_text, Pace};
use crate::plain::decode_http;
use crate::shared::{
    Answer, CatchUnwind, Held, Pending, Protocol, Shared, Slot, Stats, INFO, WARNING,
};
use crate::text::{fmt_g, py_repr_latin1};

/// How long a connection idle at the drain's start stays open to read a request already
/// sent (`DRAIN_READ_GRACE_S`).
const DRAIN_READ_GRACE: Duration = Duration::from_millis(200);
const READ_CHUNK: usize = 16 * 1024;
/// After the last answer, how long what the client still sends is read and dropped before the
/// socket closes: closing with unread bytes sends a reset, which can destroy the answer in
/// the client's buffers before it reads it (a refusal written while its body still arrives).
const LINGER: Duration = Duration::from_secs(2);

/// A head's framing and connection semantics, read once.
#[derive(Debug, Default)]
pub struct Facts {
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub keep_alive: bool,
    pub websocket: bool,
    pub upgrade: bool,
}

/// How a head is refused before its request begins: status and message.
pub type Refusal = (u16, String);

fn lower(bytes: &[u8]) -> Vec<u8> {
    bytes.to_ascii_lowercase()
}

fn tokens(value: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    value.split(|&b| b == b',').map(|t| lower(t.trim_ascii()))
}

/// Checks a complete head against the limits and the protocol, in the Python edge's order.
/// `counted`: the bytes received while it was awaited.
pub fn check_head(
    buf: &[u8],
    head: &Head,
    counted: usize,
    max_url_bytes: usize,
    max_header_bytes: usize,
) -> Result<Facts, Refusal> {
    let target = &buf[head.target.clone()];
    if target.len() > max_url_bytes {
        return Err(url_too_long(max_url_bytes));
    }
    if counted > max_header_bytes {
        let exact: usize = target.len()
            + head
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>();
        if exact > max_header_bytes {
            return Err(headers_too_long(max_header_bytes));
        }
    }
    let mut facts = Facts {
        keep_alive: head.version == 1,
        ..Facts::default()
    };
    let mut connection: Vec<Vec<u8>> = Vec::new();
    let mut upgrade_value: Option<Vec<u8>> = None;
    let mut te = false;
    for (name, value) in &head.headers {
        let name = &buf[name.clone()];
        let value = &buf[value.clone()];
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if tokens(value).any(|coding| coding != b"chunked") {
                return Err((
                    400,
                    format!(
                        "Transfer-Encoding {} is not supported: send the body chunked, or with a \
                         Content-Length (compress it with Content-Encoding: gzip or deflate)",
                        py_repr_latin1(value)
                    ),
                ));
            }
            te = true;
        } else if name.eq_ignore_ascii_case(b"content-length") {
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) || value.len() > 18 {
                return Err(invalid("Invalid character in Content-Length"));
            }
            let length: u64 = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| invalid("Invalid character in Content-Length"))?;
            if facts.content_length.is_some_and(|other| other != length) {
                return Err(invalid("Duplicate Content-Length"));
            }
            facts.content_length = Some(length);
        } else if name.eq_ignore_ascii_case(b"connection") {
            // uvicorn reads the last Connection header's tokens for an upgrade; llhttp all
            // of them for keep-alive.
            connection = tokens(value).collect();
            for token in &connection {
                if token == b"close" {
                    facts.keep_alive = false;
                } else if token == b"keep-alive" && head.version == 0 {
                    facts.keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            upgrade_value = Some(lower(value));
        }
    }
    if te {
        if facts.content_length.is_some() {
            return Err(invalid(
                "Content-Length can't be present with Transfer-Encoding",
            ));
        }
        facts.chunked = true;
    }
    if let Some(upgrade) = upgrade_value {
        if connection.iter().any(|t| t == b"upgrade") {
            facts.upgrade = true;
            facts.websocket = upgrade == b"websocket";
        }
    }
    if facts.websocket {
        return Err((
            400,
            "this server has no WebSocket endpoint; use HTTP requests".to_string(),
        ));
    }
    Ok(facts)
}

fn invalid(reason: &str) -> Refusal {
    (400, format!("the request is not valid HTTP/1.1: {reason}"))
}

fn url_too_long(limit: usize) -> Refusal {
    (
        414,
        format!("the request's URL is longer than {limit} bytes (max_url_bytes)"),
    )
}

fn headers_too_long(limit: usize) -> Refusal {
    (
        431,
        format!("the request's headers are longer than {limit} bytes (max_header_bytes)"),
    )
}

/// Limits broken by a head still incomplete: its URL so far, then every byte so far.
pub fn check_partial(buf: &[u8], max_url_bytes: usize, max_header_bytes: usize) -> Option<Refusal> {
    // Leading empty lines are skipped as the parser skips them.
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let line = &buf[start..];
    if let Some(space) = line.iter().position(|&b| b == b' ') {
        let rest = &line[space + 1..];
        let url = rest
            .iter()
            .position(|&b| b == b' ' || b == b'\r' || b == b'\n')
            .map_or(rest, |end| &rest[..end]);
        if url.len() > max_url_bytes {
            return Some(url_too_long(max_url_bytes));
        }
    }
    if buf.len() > max_header_bytes {
        return Some(headers_too_long(max_header_bytes));
    }
    None
}

/// The model and version of a native inference target, if it is one.
pub fn infer_target(target: &[u8]) -> Option<(&str, Option<&str>)> {
    let middle = target
        .strip_prefix(b"/v2/models/")?
        .strip_suffix(b"/infer")?;
    let middle = std::str::from_utf8(middle).ok()?;
    let plain = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii() && !matches!(b, b'/' | b'%' | b'?' | b'#'))
    };
    match middle.split_once('/') {
        None => plain(middle).then_some((middle, None)),
        Some((name, rest)) => {
            let version = rest.strip_prefix("versions/")?;
            (plain(name) && plain(version)).then_some((name, Some(version)))
        }
    }
}

/// Why a head may not take the native route (None: it may, with these values).
pub struct Native<'a> {
    pub model: &'a str,
    pub version: Option<&'a str>,
    pub content_length: usize,
    pub header_length: Option<usize>,
}

/// Whether a head takes the native route (see the crate's README for the list).
pub fn native_route<'a>(
    buf: &'a [u8],
    head: &Head,
    facts: &Facts,
    shared: &Shared,
) -> Option<Native<'a>> {
    let config = &shared.config;
    if !config.native_infer || head.version != 1 || facts.upgrade || facts.chunked {
        return None;
    }
    if &buf[head.method.clone()] != b"POST" {
        return None;
    }
    let (model, version) = infer_target(&buf[head.target.clone()])?;
    let content_length = usize::try_from(facts.content_length?).ok()?;
    if content_length > config.native_body_bytes || content_length > config.max_request_bytes {
        return None;
    }
    let mut header_length = None;
    let mut header_lengths = 0;
    let mut authorized = config.auth.is_none();
    for (name, value) in &head.headers {
        let name = &buf[name.clone()];
        let value = &buf[value.clone()];
        let refused = match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => !config.hosts.allows(value),
            6 => name.eq_ignore_ascii_case(b"expect") || name.eq_ignore_ascii_case(b"origin"),
            7 => name.eq_ignore_ascii_case(b"referer"),
            12 => {
                name.eq_ignore_ascii_case(b"x-request-id")
                    || (name.eq_ignore_ascii_case(b"content-type")
                        && crate::hosts::is_text_plain(value))
            }
            13 if name.eq_ignore_ascii_case(b"authorization") => {
                if let Some(accepted) = &config.auth {
                    authorized |= crate::hosts::one_of(value, accepted);
                }
                false
            }
            14 => name.eq_ignore_ascii_case(b"sec-fetch-site"),
            15 if name.eq_ignore_ascii_case(b"accept-encoding") => {
                !value.trim_ascii().eq_ignore_ascii_case(b"identity")
            }
            16 => name.eq_ignore_ascii_case(b"content-encoding"),
            17 => name.eq_ignore_ascii_case(b"transfer-encoding"),
            31 if name.eq_ignore_ascii_case(b"inference-header-content-length") => {
                header_lengths += 1;
                header_length = whole_number(value);
                header_length.is_none()
            }
            _ => false,
        };
        if refused {
            return None;
        }
    }
    if !authorized || header_lengths > 1 {
        return None;
    }
    Some(Native {
        model,
        version,
        content_length,
        header_length,
    })
}

/// A header's whole number as corral's `int_header` reads it: 1 to 18 ASCII digits.
fn whole_number(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// How a connection's turn ended.
enum Next {
    /// The next request (the connection stays open).
    Continue,
    /// The connection closes.
    Close,
}

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    buf: BytesMut,
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

/// What woke a connection waiting for its next request.
enum Woke {
    RoomAsked,
    Drain,
}

/// Serves one accepted connection to its end. `at_cap`: the connections open before it, when
/// that was the cap: room is made, or the cap's 503 is written once the client sends its
/// first bytes (as the Python edge does).
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    place: Admitted,
    slot: Arc<Slot>,
    at_cap: Option<usize>,
) {
    let shared = Arc::clone(&place.shared);
    let refused = match at_cap {
        Some(open) if !make_room(&shared, &slot).await => Some(format!(
            "the server has {open} connections open, its limit (max_connections); try again \
             later"
        )),
        _ => None,
    };
    let _ = stream.set_nodelay(true);
    let mut connection = Connection {
        stream,
        peer,
        buf: BytesMut::with_capacity(READ_CHUNK),
        shared,
        slot,
    };
    let mut refused = refused;
    loop {
        if connection.buf.is_empty() && !connection.await_request().await {
            break;
        }
        if let Some(message) = refused.take() {
            connection.refuse(503, &message).await;
            break;
        }
        // A panic in one request's handling answers that request 500 and ends the
        // connection (its place in the stream is lost); the process and the others go on.
        let outcome = CatchUnwind(Box::pin(connection.one_request())).await;
        match outcome {
            Ok(Next::Continue) => continue,
            Ok(Next::Close) => break,
            Err(_) => {
                Stats::add(&connection.shared.stats.panics, 1);
                connection
                    .answer_error(
                        500,
                        "internal error: the edge failed on this request",
                        &Facts::default(),
                    )
                    .await;
                break;
            }
        }
    }
    // Its place under the cap is given back before the client can see the close, so that a
    // connection the client opens next finds it free.
    drop(place);
    let _ = connection.stream.shutdown().await;
    // A lingering close: the client's leftover bytes are read and dropped until it closes
    // too (its next read sees the end), LINGER passes, or the drain begins (which waits for
    // answers, not for clients to close).
    let mut sink = vec![0u8; READ_CHUNK];
    let shared = Arc::clone(&connection.shared);
    let linger =
        async { while matches!(connection.stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    tokio::select! {
        _ = tokio::time::timeout(LINGER, linger) => {}
        () = shared.draining.wait() => {}
    }
}

impl Connection {
    fn config(&self) -> &crate::shared::Config {
        &self.shared.config
    }

    /// Reads into the buffer; Ok(0) at the end of the stream.
    async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        Stats::add(&self.shared.stats.bytes_in, n);
        Ok(n)
    }

    async fn write(&mut self, bytes: &[u8]) -> bool {
        Stats::add(&self.shared.stats.bytes_out, bytes.len());
        self.stream.write_all(bytes).await.is_ok()
    }

    /// Whether the connection stays open after this request's answer: its client asked so,
    /// and the drain has not begun, or the next request had arrived already when it began (a
    /// request received is answered; the last one received says `Connection: close`).
    fn keeps_open(&self, facts: &Facts) -> bool {
        facts.keep_alive && (!self.shared.draining.is_raised() || !self.buf.is_empty())
    }

    async fn refuse(&mut self, status: u16, message: &str) {
        let answer = http_refusal(status, message);
        self.write(&answer).await;
    }

    /// Waits for a request's first byte, idle: false if the connection should close (idle
    /// timeout, closed for room or by the drain, the client left).
    async fn await_request(&mut self) -> bool {
        let shared = Arc::clone(&self.shared);
        let slot = Arc::clone(&self.slot);
        slot.idle.store(true, std::sync::atomic::Ordering::SeqCst);
        let idle = self.config().idle_timeout;
        let result = loop {
            if shared.draining.is_raised() || shared.stopping.is_raised() {
                // A request may already wait in the socket: read it, else close.
                break matches!(
                    tokio::time::timeout(DRAIN_READ_GRACE, self.read_more()).await,
                    Ok(Ok(n)) if n > 0
                );
            }
            let woke = tokio::select! {
                read = tokio::time::timeout(idle, self.read_more()) => {
                    break matches!(read, Ok(Ok(n)) if n > 0);
                }
                () = slot.room_asked.notified() => Woke::RoomAsked,
                () = slot.close.notified() => Woke::Drain,
                () = shared.draining.wait() => Woke::Drain,
            };
            if matches!(woke, Woke::RoomAsked) {
                // Idle unless a request's bytes arrived unread: then it stays, and the one
                // asking looks elsewhere.
                let verdict = slot.verdict_lock.lock().take();
                let read = self.stream.try_read_buf(&mut self.buf);
                let stays = matches!(read, Ok(n) if n > 0);
                if let Ok(n) = read {
                    Stats::add(&shared.stats.bytes_in, n);
                }
                if let Some(verdict) = verdict {
                    let _ = verdict.send(!stays);
                }
                break stays;
            }
        };
        slot.idle.store(false, std::sync::atomic::Ordering::SeqCst);
        result
    }

    /// Reads and answers one request whose first bytes are in the buffer.
    async fn one_request(&mut self) -> Next {
        let (max_url, max_header) = (self.config().max_url_bytes, self.config().max_header_bytes);
        let deadline = tokio::time::Instant::now() + self.config().header_timeout;
        let received = Instant::now();
        let head = loop {
            match parse_head(&self.buf) {
                Parsed::Complete(head) => break head,
                Parsed::Invalid(error) => {
                    // Said before the answer is written: in the log before the client's next step.
                    self.shared.say(
                        WARNING,
                        format!(
                            "an invalid HTTP request was received ({error}); answered 400, \
                             connection closed"
                        ),
                    );
                    self.refuse(400, &format!("the request is not valid HTTP/1.1: {error}"))
                        .await;
                    return Next::Close;
                }
                Parsed::Partial => {
                    if let Some((status, message)) = check_partial(&self.buf, max_url, max_header) {
                        self.refuse(status, &message).await;
                        return Next::Close;
                    }
                    match timeout_at(deadline, self.read_more()).await {
                        Ok(Ok(n)) if n > 0 => {}
                        Ok(_) => return Next::Close,
                        Err(_) => {
                            let timeout = fmt_g(self.config().header_timeout_s);
                            self.refuse(
                                408,
                                &format!(
                                    "the request's headers did not arrive within {timeout} s \
                                     (header_timeout_s)"
                                ),
                            )
                            .await;
                            return Next::Close;
                        }
                    }
                }
            }
        };
        let counted = self.buf.len();
        let facts = match check_head(&self.buf, &head, counted, max_url, max_header) {
            Ok(facts) => facts,
            Err((status, message)) => {
                if status == 400 {
                    // The protocol refused (its framing, an upgrade): the Python edge logs these.
                    self.shared.say(
                        WARNING,
                        format!("{message}; answered 400, connection closed"),
                    );
                }
                self.refuse(status, &message).await;
                return Next::Close;
            }
        };
        let shared = Arc::clone(&self.shared);
        let native = native_route(&self.buf, &head, &facts, &shared).map(|n| {
            (
                n.model.to_string(),
                n.version.map(str::to_string),
                n.content_length,
                n.header_length,
            )
        });
        if let Some((model, version, length, header_length)) = native {
            return self
                .native(head, facts, model, version, length, header_length, received)
                .await;
        }
        let head_bytes = self.buf.split_to(head.len).freeze();
        self.bridge(head, head_bytes, &facts, None).await
    }

    /// A native request: its body read and held in the budget, decoded, handed to Python.
    #[allow(clippy::too_many_arguments)]
    async fn native(
        &mut self,
        head: Head,
        facts: Facts,
        model: String,
        version: Option<String>,
        length: usize,
        header_length: Option<usize>,
        received: Instant,
    ) -> Next {
        let shared = Arc::clone(&self.shared);
        let total = head.len + length;
        let mut held = Held::new(Arc::clone(&shared.budget));
        let mut kept = shared.budget.fits(length);
        if kept {
            kept = held.grow(self.buf.len().min(total) - head.len.min(self.buf.len()));
        }
        let mut pace = Pace::new(self.config(), Instant::now());
        pace.arrived(
            self.buf.len().min(total) - head.len.min(self.buf.len()),
            Instant::now(),
        );
        while self.buf.len() < total {
            let before = self.buf.len();
            match timeout_at(pace.deadline().into(), self.read_more()).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Next::Close,
                Err(_) => {
                    if let Err(slow) = pace.check(Instant::now()) {
                        // Cut by silence or by rate: `held` gives its bytes back as it drops.
                        let message = slow_text(&slow, self.config());
                        self.shared.say(INFO, format!("{message}; answered 408"));
                        self.refuse(408, &message).await;
                        return Next::Close;
                    }
                    continue;
                }
            }
            let arrived = self.buf.len().min(total) - before.min(total);
            pace.arrived(arrived, Instant::now());
            if kept && !held.grow(arrived) {
                kept = false; // the budget ran out: the bridge answers it
            }
        }
        let request = self.buf.split_to(total).freeze();
        if !kept {
            drop(held);
            let head_bytes = request.slice(..head.len);
            return self
                .bridge(
                    head,
                    head_bytes,
                    &facts,
                    Some(request.slice(total - length..)),
                )
                .await;
        }
        let body = request.slice(head.len..);
        let decoded = {
            let shared = Arc::clone(&shared);
            let model = model.clone();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                shared.maybe_panic(&model);
                decode_http(&body, header_length)
            }))
        };
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(_) => {
                Stats::add(&shared.stats.panics, 1);
                return self
                    .answer_error(
                        500,
                        "internal error: the edge failed on this request",
                        &facts,
                    )
                    .await;
            }
        };
        let Some(plain) = decoded else {
            drop(held);
            let head_bytes = request.slice(..head.len);
            let body = request.slice(head.len..);
            return self.bridge(head, head_bytes, &facts, Some(body)).await;
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = Pending {
            model,
            version,
            protocol: Protocol::Http,
            request: plain,
            timeout_us: None,
            received,
            reply,
            held,
        };
        if let Err(refused) = shared.queue.push(pending) {
            drop(refused);
            Stats::add(&shared.stats.refused_pending, 1);
            let message = format!(
                "the server has {} requests waiting for Python, its limit (max_pending); \
                 try again later",
                shared.queue.limit()
            );
            return self.answer_error(429, &message, &facts).await;
        }
        Stats::add(&shared.stats.native, 1);
        let answered = tokio::select! {
            answer = answer => answer.map_err(|_| shared.cut.is_raised()),
            () = shared.cut.wait() => Err(true),
        };
        match answered {
            Ok(Answer::Http {
                status,
                lines,
                body,
            }) => {
                let keep_alive = self.keeps_open(&facts);
                let mut out = Vec::with_capacity(128 + lines.len() + body.len());
                out.extend_from_slice(&crate::text::status_line(status));
                shared.dates.push_defaults(&mut out);
                out.extend_from_slice(&lines);
                out.extend_from_slice(if keep_alive {
                    b"\r\n"
                } else {
                    b"connection: close\r\n\r\n"
                });
                out.extend_from_slice(&body);
                if !self.write(&out).await || !keep_alive {
                    return Next::Close;
                }
                Next::Continue
            }
            Ok(Answer::Bridge) => {
                // Python sends it the general way: the request as it came, to its edge.
                let head_bytes = request.slice(..head.len);
                let body = request.slice(head.len..);
                self.bridge(head, head_bytes, &facts, Some(body)).await
            }
            Ok(Answer::Grpc { .. }) | Err(false) => {
                // Lost on its way to Python (the edge stops, or take() failed): answered as
                // a call Python dropped.
                self.answer_error(500, crate::shared::DROPPED, &facts).await
            }
            Err(true) => {
                // The drain ran out: answered 503, as the Python edge answers a request its
                // drain cuts.
                Stats::add(&shared.stats.cut, 1);
                let body = crate::text::error_body(
                    "the server is shutting down and its drain timeout ran out",
                );
                let mut lines = Vec::new();
                lines.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
                lines.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
                lines.extend_from_slice(b"\r\n");
                let mut out = crate::text::status_line(503);
                shared.dates.push_defaults(&mut out);
                out.extend_from_slice(&lines);
                out.extend_from_slice(b"connection: close\r\n\r\n");
                out.extend_from_slice(&body);
                self.write(&out).await;
                Next::Close
            }
        }
    }

    /// An error answered by the edge itself on a request it read whole (a JSON error with
    /// the default headers, as the Python direct route answers errors).
    async fn answer_error(&mut self, status: u16, message: &str, facts: &Facts) -> Next {
        let body = crate::text::error_body(message);
        let keep_alive = self.keeps_open(facts);
        let out = crate::encode::http_response(
            status,
            &self.shared.dates,
            crate::encode::JSON,
            b"",
            &body,
            keep_alive,
        );
        if !self.write(&out).await || !keep_alive {
            return Next::Close;
        }
        Next::Continue
    }

    /// Forwards a request to the Python edge and relays its answer. `body`: the whole body
    /// when it was read already; else it is read from the connection by its framing.
    async fn bridge(
        &mut self,
        head: Head,
        head_bytes: Bytes,
        facts: &Facts,
        body: Option<Bytes>,
    ) -> Next {
        let shared = Arc::clone(&self.shared);
        Stats::add(&shared.stats.bridged, 1);
        let is_head = &head_bytes[head.method.clone()] == b"HEAD";
        let forwarded = bridge::forwarded_head(&head_bytes, &head, self.peer);
        let source = match body {
            Some(body) => BodySource::Whole(body),
            None if facts.chunked => BodySource::Chunked(Chunked::default()),
            None => BodySource::Length(facts.content_length.unwrap_or(0)),
        };
        let keep_alive = facts.keep_alive && !facts.upgrade;
        let outcome = CatchUnwind(Box::pin(bridge::exchange(
            &shared,
            &mut self.stream,
            &mut self.buf,
            forwarded,
            source,
            is_head,
        )))
        .await;
        match outcome {
            Ok(bridge::Outcome::Done { close }) => {
                if close || !keep_alive || !self.keeps_open(facts) {
                    Next::Close
                } else {
                    Next::Continue
                }
            }
            Ok(bridge::Outcome::Unreachable(message)) => {
                self.answer_error(503, &message, &Facts::default()).await;
                Next::Close
            }
            Ok(bridge::Outcome::Cut) => {
                Stats::add(&shared.stats.cut, 1);
                self.answer_error(
                    503,
                    "the server is shutting down and its drain timeout ran out",
                    &Facts::default(),
                )
                .await;
                Next::Close
            }
            Ok(bridge::Outcome::Broken) => Next::Close,
            Err(_) => {
                Stats::add(&shared.stats.panics, 1);
                self.answer_error(
                    500,
                    "internal error: the edge failed on this request",
                    &Facts::default(),
                )
                .await;
                Next::Close
            }
        }
    }
}

/// Registers a new connection: its id, its slot, and the connections open before it when
/// that is the cap already (then it needs [`make_room`], or is refused).
pub fn admit(shared: &Shared) -> (u64, Arc<Slot>, Option<usize>) {
    // A new connection is idle until its first request begins, as the Python edge counts it:
    // past the cap, one that has sent nothing yet may be closed to make room.
    let slot = Arc::new(Slot::default());
    slot.idle.store(true, std::sync::atomic::Ordering::SeqCst);
    let id = shared
        .next_slot
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut slots = shared.slots.lock();
    let open = slots.len();
    slots.push((id, Arc::clone(&slot)));
    (
        id,
        slot,
        (open >= shared.config.max_connections).then_some(open),
    )
}

/// How long a connection asked to close for room has to say whether it did.
const ROOM_VERDICT_WAIT: Duration = Duration::from_secs(1);

/// Closes an idle connection to make room for `own` (as nginx reuses keep-alive connections):
/// each idle one is asked in turn, and closes unless a request of its own arrived meanwhile.
/// False when none would close: the new connection is then answered 503.
pub async fn make_room(shared: &Shared, own: &Arc<Slot>) -> bool {
    let tries = shared.slots.lock().len();
    for _ in 0..tries {
        let victim = shared
            .slots
            .lock()
            .iter()
            .find(|(_, other)| {
                !Arc::ptr_eq(other, own)
                    && other.idle.swap(false, std::sync::atomic::Ordering::SeqCst)
            })
            .map(|(_, other)| Arc::clone(other));
        let Some(victim) = victim else {
            return false;
        };
        let (verdict, said) = tokio::sync::oneshot::channel();
        *victim.verdict_lock.lock() = Some(verdict);
        victim.room_asked.notify_one();
        // It closed, or ended before it could say (its place is free either way); else it
        // had a request, or said nothing in time, and the next idle one is asked.
        if let Ok(Ok(true) | Err(_)) = tokio::time::timeout(ROOM_VERDICT_WAIT, said).await {
            return true;
        }
    }
    false
}

/// Forgets a closed connection.
pub fn release(shared: &Shared, id: u64) {
    shared.slots.lock().retain(|(other, _)| *other != id);
}

/// Releases a connection's place when its task ends, however it ends.
pub struct Admitted {
    pub shared: Arc<Shared>,
    pub id: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        release(&self.shared, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(infer_target(b"/v2/models/m/infer"), Some(("m", None)));
        assert_eq!(
            infer_target(b"/v2/models/m/versions/2/infer"),
            Some(("m", Some("2")))
        );
        assert_eq!(infer_target(b"/v2/models/m/x/infer"), None);
        assert_eq!(infer_target(b"/v2/models//infer"), None);
        assert_eq!(infer_target(b"/v2/models/a%20/infer"), None);
        assert_eq!(infer_target(b"/v2/models/m/infer?x"), None);
    }

    #[test]
    fn heads() {
        let raw = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        let Parsed::Complete(head) = parse_head(raw) else {
            panic!("complete");
        };
        assert_eq!(head.len, raw.len() - 2);
        let facts = check_head(raw, &head, raw.len(), 8192, 65536).unwrap_or_default();
        assert_eq!(facts.content_length, Some(2));
        assert!(facts.keep_alive);
        let te = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n";
        let Parsed::Complete(head) = parse_head(te) else {
            panic!("complete");
        };
        let refusal = check_head(te, &head, te.len(), 8192, 65536).err();
        assert_eq!(refusal.map(|r| r.0), Some(400));
    }
}
