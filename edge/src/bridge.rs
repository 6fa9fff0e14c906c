//! The HTTP bridge: a request the native edge does not answer itself goes to the Python edge
//! (uvicorn on a Unix socket) byte for byte, and its answer comes back byte for byte.
//!
//! The head is forwarded as received, with one header added, `x-corral-peer: <ip>:<port>`
//! (the client's address; one a client sent is dropped). The body follows as its framing
//! says (Content-Length or chunked, tracked so that the client's connection stays in step),
//! while the answer is relayed: interim (1xx) answers, the head, the body (Content-Length,
//! chunked, or until the bridge closes). A pooled bridge connection found closed before a byte
//! of the answer arrived is replaced and the request sent again when it can be.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::chunked::Chunked;
use crate::head::Head;
use crate::shared::{Shared, Stats};

/// Pooled bridge connections older than this are not reused (uvicorn's keep-alive timeout
/// defaults to 5 s; the Python edge's is set above this).
const POOL_AGE: Duration = Duration::from_secs(2);
const POOL_SIZE: usize = 64;
/// How long a bridged body may go without a byte before the edge gives up on it itself (the
/// Python edge answers 408 at its own body timeout first).
const BODY_BACKSTOP: Duration = Duration::from_secs(5);
const PEER_HEADER: &[u8] = b"x-corral-peer";

/// Where a bridged request's body comes from.
pub enum BodySource {
    /// Read already, whole.
    Whole(Bytes),
    /// This many bytes, some maybe in the connection's buffer.
    Length(u64),
    /// Chunked, its end found as it arrives.
    Chunked(Chunked),
}

/// How a bridged exchange ended.
pub enum Outcome {
    /// Answered; `close`: the client's connection must close now.
    Done { close: bool },
    /// No answer could be had from the Python edge: the edge answers 503 with this text.
    Unreachable(String),
    /// The drain ran out before an answer began.
    Cut,
    /// The connection cannot go on (the client left, or the answer broke off).
    Broken,
}

/// The head as forwarded: its lines as received, less any `x-corral-peer`, plus the client's.
pub fn forwarded_head(raw: &[u8], head: &Head, peer: SocketAddr) -> Vec<u8> {
    let raw = &raw[..head.len];
    let mut out = Vec::with_capacity(raw.len() + 48);
    let mut lines = raw
        .split_inclusive(|&b| b == b'\n')
        .skip_while(|line| line.trim_ascii().is_empty());
    if let Some(request_line) = lines.next() {
        out.extend_from_slice(request_line);
    }
    for line in lines {
        if line.trim_ascii().is_empty() {
            break; // the head's end
        }
        let name = line.split(|&b| b == b':').next().unwrap_or(b"");
        if name.trim_ascii().eq_ignore_ascii_case(PEER_HEADER) {
            continue;
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(PEER_HEADER);
    out.extend_from_slice(b": ");
    out.extend_from_slice(peer.to_string().as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out
}

/// The place in the Python edge's answer.
enum Relay {
    Head,
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

struct Answer {
    state: Relay,
    /// The client's connection closes after this answer.
    close: bool,
    /// A byte of the answer went to the client.
    begun: bool,
    is_head: bool,
    /// The edge ends the client's connection after this answer whatever the Python edge
    /// said: its head, relayed, says `connection: close`.
    ends_connection: bool,
}

impl Answer {
    /// Moves what `input` holds of the answer into `out`; Err if it breaks.
    fn feed(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<(), ()> {
        loop {
            match &mut self.state {
                Relay::Done => return Ok(()),
                Relay::Head => {
                    let mut headers = [httparse::EMPTY_HEADER; 64];
                    let mut response = httparse::Response::new(&mut headers);
                    let len = match response.parse(input) {
                        Ok(httparse::Status::Complete(len)) => len,
                        Ok(httparse::Status::Partial) if input.len() < 1 << 20 => return Ok(()),
                        _ => return Err(()),
                    };
                    let status = response.code.unwrap_or(500);
                    let mut length = None;
                    let mut chunked = false;
                    let mut close = false;
                    for header in response.headers.iter() {
                        let name = header.name.as_bytes();
                        if name.eq_ignore_ascii_case(b"content-length") {
                            length = std::str::from_utf8(header.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<u64>().ok());
                        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                            chunked = header
                                .value
                                .split(|&b| b == b',')
                                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                        } else if name.eq_ignore_ascii_case(b"connection") {
                            close |= header
                                .value
                                .split(|&b| b == b',')
                                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
                        }
                    }
                    let head = input.split_to(len);
                    if (100..200).contains(&status) && status != 101 {
                        out.extend_from_slice(&head);
                        continue; // an interim answer: the final one follows
                    }
                    if self.ends_connection && !close {
                        // The edge ends this connection: the answer says so.
                        out.extend_from_slice(&head[..head.len() - 2]);
                        out.extend_from_slice(b"connection: close\r\n\r\n");
                        close = true;
                    } else {
                        out.extend_from_slice(&head);
                    }
                    self.close |= close;
                    self.state = if self.is_head || status == 204 || status == 304 {
                        Relay::Done
                    } else if chunked {
                        Relay::Chunked(Chunked::default())
                    } else if let Some(length) = length {
                        if length == 0 {
                            Relay::Done
                        } else {
                            Relay::Length(length)
                        }
                    } else {
                        self.close = true;
                        Relay::UntilClose
                    };
                }
                Relay::Length(remaining) => {
                    let taken = (input.len() as u64).min(*remaining) as usize;
                    out.extend_from_slice(&input[..taken]);
                    input.advance(taken);
                    *remaining -= taken as u64;
                    if *remaining == 0 {
                        self.state = Relay::Done;
                    }
                    return Ok(());
                }
                Relay::Chunked(chunked) => {
                    let taken = chunked.feed(input).map_err(|_| ())?;
                    out.extend_from_slice(&input[..taken]);
                    input.advance(taken);
                    if chunked.done() {
                        self.state = Relay::Done;
                    }
                    return Ok(());
                }
                Relay::UntilClose => {
                    out.extend_from_slice(input);
                    input.clear();
                    return Ok(());
                }
            }
        }
    }
}

async fn connect(shared: &Shared) -> Result<(UnixStream, bool), String> {
    let Some(path) = shared.config.http_bridge.as_deref() else {
        return Err(
            "this request is not served by the native edge, and no HTTP bridge to \
                    the Python edge is configured (http_bridge)"
                .to_string(),
        );
    };
    {
        let mut pool = shared.http_pool.lock();
        while let Some((stream, since)) = pool.pop() {
            if since.elapsed() < POOL_AGE {
                return Ok((stream, true));
            }
        }
    }
    UnixStream::connect(path)
        .await
        .map(|s| (s, false))
        .map_err(|error| {
            format!("the Python edge's HTTP bridge at {path} cannot be reached: {error}")
        })
}

fn give_back(shared: &Shared, stream: UnixStream) {
    let mut pool = shared.http_pool.lock();
    if pool.len() < POOL_SIZE {
        pool.push((stream, Instant::now()));
    }
}

/// Takes what the connection's buffer holds of the body; returns the bytes and whether the
/// body is complete, or Err when a chunked body's framing breaks (all of the buffer then).
fn body_part(source: &mut BodySource, buf: &mut BytesMut) -> (Bytes, bool, bool) {
    match source {
        BodySource::Whole(body) => (std::mem::take(body), true, false),
        BodySource::Length(remaining) => {
            let taken = (buf.len() as u64).min(*remaining) as usize;
            *remaining -= taken as u64;
            (buf.split_to(taken).freeze(), *remaining == 0, false)
        }
        BodySource::Chunked(chunked) => match chunked.feed(buf) {
            Ok(taken) => (buf.split_to(taken).freeze(), chunked.done(), false),
            // Forwarded as it is: the Python edge says what is wrong, and the connection ends.
            Err(_) => (buf.split().freeze(), false, true),
        },
    }
}

/// Forwards one request and relays its answer (see the module's doc).
pub async fn exchange(
    shared: &Shared,
    client: &mut TcpStream,
    buf: &mut BytesMut,
    forwarded: Vec<u8>,
    mut source: BodySource,
    is_head: bool,
) -> Outcome {
    let (first, mut body_done, mut broken) = body_part(&mut source, buf);
    let mut initial = forwarded;
    initial.extend_from_slice(&first);
    let mut answer = Answer {
        state: Relay::Head,
        close: false,
        begun: false,
        is_head,
        ends_connection: false,
    };
    // Bytes sent past `initial`: once there are any, the request cannot be sent again.
    let mut replayable = true;
    let mut tries = 0;
    'connection: loop {
        tries += 1;
        let (mut bridge, pooled) = match connect(shared).await {
            Ok(connection) => connection,
            Err(message) => return Outcome::Unreachable(message),
        };
        // Whether the body is still forwarded: the Python edge may answer before it has read
        // the whole body (a refusal) and close; its answer is then read and relayed all the
        // same, and the client's connection closes after it.
        let mut forwarding = true;
        if bridge.write_all(&initial).await.is_err() {
            if pooled && tries < 3 {
                continue 'connection;
            }
            forwarding = false;
        }
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = Vec::with_capacity(16 * 1024);
        loop {
            let reading_client = forwarding && !body_done && !broken;
            tokio::select! {
                read = tokio::time::timeout(BODY_BACKSTOP + shared.config.body_timeout, client.read_buf(buf)), if reading_client => {
                    match read {
                        Ok(Ok(n)) if n > 0 => {
                            Stats::add(&shared.stats.bytes_in, n);
                            let (part, done, bad) = body_part(&mut source, buf);
                            body_done = done;
                            broken = bad;
                            replayable = false;
                            if bridge.write_all(&part).await.is_err() {
                                forwarding = false; // its answer, if any, is read next
                            }
                        }
                        _ => return Outcome::Broken, // the client left, or stopped sending
                    }
                }
                read = bridge.read_buf(&mut input) => {
                    let n = read.unwrap_or(0);
                    if n == 0 {
                        if matches!(answer.state, Relay::UntilClose) {
                            return Outcome::Done { close: true };
                        }
                        if !answer.begun {
                            if pooled && replayable && tries < 3 {
                                continue 'connection;
                            }
                            return Outcome::Unreachable(bridge_failed(shared));
                        }
                        return Outcome::Broken;
                    }
                    out.clear();
                    // The client's connection ends after this answer when the drain began (unless
                    // its next request has arrived already: a request received is answered), or
                    // when the request's body is not all read (answered before it, a refusal):
                    // a client reusing the connection would find it closed.
                    answer.ends_connection = (shared.draining.is_raised() && buf.is_empty())
                        || !body_done
                        || broken
                        || !forwarding;
                    if answer.feed(&mut input, &mut out).is_err() {
                        return Outcome::Broken;
                    }
                    if !out.is_empty() {
                        answer.begun = true;
                        Stats::add(&shared.stats.bytes_out, out.len());
                        if client.write_all(&out).await.is_err() {
                            return Outcome::Broken;
                        }
                    }
                    if matches!(answer.state, Relay::Done) {
                        let close = answer.close || !body_done || broken || !forwarding;
                        if !close && input.is_empty() {
                            give_back(shared, bridge);
                        }
                        return Outcome::Done { close };
                    }
                }
                () = shared.cut.wait() => {
                    return if answer.begun { Outcome::Broken } else { Outcome::Cut };
                }
            }
        }
    }
}

fn bridge_failed(shared: &Shared) -> String {
    format!(
        "the Python edge's HTTP bridge at {} closed the connection without an answer",
        shared.config.http_bridge.as_deref().unwrap_or("?")
    )
}
