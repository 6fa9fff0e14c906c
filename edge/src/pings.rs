//! The gRPC ping policy, as grpc core holds it: a client may ping once per
//! `min_ping_interval`; each ping sooner than that is a strike, and past `MAX_PING_STRIKES`
//! the connection is sent GOAWAY `ENHANCE_YOUR_CALM` ("too_many_pings") and closed. The
//! strikes start again whenever the server sends a call's HEADERS or DATA
//! (`grpc.http2.min_ping_interval_without_data_ms`, `grpc.http2.max_ping_strikes`).
//!
//! hyper answers pings itself and has no such policy, so the connection's bytes are watched
//! as they pass: [`FrameScan`] finds the frame headers in each direction.

use std::time::{Duration, Instant};

/// Strikes allowed before the GOAWAY (grpc core's default, which the Python edge keeps).
pub const MAX_PING_STRIKES: u32 = 2;
const HEADER: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;
const GOAWAY: u8 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Finds frame headers in a stream of HTTP/2 frames fed in pieces of any size.
#[derive(Debug, Default)]
pub struct FrameScan {
    header: [u8; HEADER],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: usize,
}

/// A frame's header: its type, flags and stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHead {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameScan {
    /// Passes `bytes`; calls `seen` with each frame header completed in them.
    pub fn feed(&mut self, mut bytes: &[u8], mut seen: impl FnMut(FrameHead)) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEADER {
                let h = &self.header;
                self.payload_left =
                    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                self.have = 0;
                seen(FrameHead {
                    kind: h[3],
                    flags: h[4],
                    stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                });
            }
        }
    }

    /// Whether the bytes passed so far end on a frame's end (a frame may be written next).
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }
}

/// One connection's ping policy.
#[derive(Debug)]
pub struct PingPolice {
    min_interval: Duration,
    last_ping: Option<Instant>,
    strikes: u32,
    /// The highest stream a client opened (for the GOAWAY's last stream).
    last_stream: u32,
    incoming: FrameScan,
    outgoing: FrameScan,
}

impl PingPolice {
    pub fn new(min_interval: Duration) -> Self {
        Self {
            min_interval,
            last_ping: None,
            strikes: 0,
            last_stream: 0,
            incoming: FrameScan::default(),
            outgoing: FrameScan::default(),
        }
    }

    /// Passes bytes the client sent; true once the client has pinged too often.
    pub fn received(&mut self, bytes: &[u8], now: Instant) -> bool {
        let mut pings = 0u32;
        let last_stream = &mut self.last_stream;
        self.incoming.feed(bytes, |head| {
            if head.kind == PING && head.flags & ACK == 0 {
                pings += 1;
            } else if head.kind == HEADERS {
                *last_stream = (*last_stream).max(head.stream);
            }
        });
        for _ in 0..pings {
            if self
                .last_ping
                .is_some_and(|last| now.duration_since(last) < self.min_interval)
            {
                self.strikes += 1;
            }
            self.last_ping = Some(now);
        }
        self.strikes > MAX_PING_STRIKES
    }

    /// Passes bytes the server writes: a call's HEADERS or DATA forgives the strikes.
    pub fn sent(&mut self, bytes: &[u8]) {
        let mut forgiven = false;
        self.outgoing.feed(bytes, |head| {
            forgiven |= head.kind == HEADERS || head.kind == DATA;
        });
        if forgiven {
            self.strikes = 0;
        }
    }

    /// The GOAWAY to send, if the server's bytes end on a frame's end (else none can be).
    pub fn goaway(&self) -> Option<Vec<u8>> {
        if !self.outgoing.at_boundary() {
            return None;
        }
        let debug = b"too_many_pings";
        let length = 8 + debug.len();
        let mut frame = Vec::with_capacity(HEADER + length);
        frame.extend_from_slice(&u32::try_from(length).unwrap_or(0).to_be_bytes()[1..]);
        frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(&self.last_stream.to_be_bytes());
        frame.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
        frame.extend_from_slice(debug);
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_are_found_in_pieces_of_any_size() {
        let mut bytes = frame(0x4, 0, 0, &[0; 6]);
        bytes.extend(frame(PING, 0, 0, &[7; 8]));
        bytes.extend(frame(HEADERS, 4, 3, b"abc"));
        for piece in 1..bytes.len() {
            let mut scan = FrameScan::default();
            let mut seen = Vec::new();
            for chunk in bytes.chunks(piece) {
                scan.feed(chunk, |head| seen.push((head.kind, head.stream)));
            }
            assert_eq!(seen, vec![(0x4, 0), (PING, 0), (HEADERS, 3)]);
            assert!(scan.at_boundary());
        }
    }

    #[test]
    fn the_third_quick_strike_ends_it_and_a_call_forgives() {
        let now = Instant::now();
        let ping = frame(PING, 0, 0, &[0; 8]);
        let mut police = PingPolice::new(Duration::from_secs(30));
        assert!(!police.received(&ping, now)); // the first: no strike
        assert!(!police.received(&ping, now)); // 1
        assert!(!police.received(&ping, now)); // 2
        police.sent(&frame(DATA, 0, 1, b"x")); // an answer forgives
        assert!(!police.received(&ping, now));
        assert!(!police.received(&ping, now));
        assert!(police.received(&[ping.clone(), ping].concat(), now));
        let goaway = police.goaway().unwrap();
        assert_eq!(goaway[3], GOAWAY);
        assert_eq!(&goaway[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
    }

    #[test]
    fn pings_at_the_interval_and_acks_are_no_strikes() {
        let start = Instant::now();
        let mut police = PingPolice::new(Duration::from_secs(1));
        for i in 0..10 {
            let at = start + Duration::from_secs(i);
            assert!(!police.received(&frame(PING, 0, 0, &[0; 8]), at));
            assert!(!police.received(&frame(PING, ACK, 0, &[0; 8]), at));
        }
    }

    #[test]
    fn no_goaway_mid_frame() {
        let mut police = PingPolice::new(Duration::from_secs(1));
        police.sent(&frame(DATA, 0, 1, b"abcdef")[..12]);
        assert!(police.goaway().is_none());
        police.sent(b"def");
        assert!(police.goaway().is_some());
    }
}
