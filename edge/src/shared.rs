//! What every connection and the Python side share: the limits, the byte budget, the
//! pending calls' queue, the counters, the open connections and the drain's signals.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::{oneshot, Notify};

use crate::hosts::HostPolicy;
use crate::plain::PlainRequest;

/// A byte budget shared by everything that holds request bodies (atomics, no lock).
#[derive(Debug)]
pub struct Budget {
    held: AtomicUsize,
    limit: usize,
}

impl Budget {
    pub fn new(limit: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            limit,
        }
    }

    /// Reserves `n` bytes if they fit now.
    pub fn try_grow(&self, n: usize) -> bool {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let Some(next) = held.checked_add(n).filter(|next| *next <= self.limit) else {
                return false;
            };
            match self
                .held
                .compare_exchange_weak(held, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => held = actual,
            }
        }
    }

    /// Whether `n` more bytes fit now (nothing reserved).
    pub fn fits(&self, n: usize) -> bool {
        self.held
            .load(Ordering::Relaxed)
            .checked_add(n)
            .is_some_and(|next| next <= self.limit)
    }

    /// Gives back `n` bytes (never below zero).
    pub fn give_back(&self, n: usize) {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let next = held.saturating_sub(n);
            match self
                .held
                .compare_exchange_weak(held, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => held = actual,
            }
        }
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// Bytes held in a budget, given back once when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    size: usize,
}

impl Held {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self { budget, size: 0 }
    }

    /// Grows the reservation by `n`; false (and unchanged) if that does not fit.
    pub fn grow(&mut self, n: usize) -> bool {
        if self.budget.try_grow(n) {
            self.size += n;
            true
        } else {
            false
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.size);
    }
}

/// Every bound the edge holds connections and requests to.
#[derive(Clone, Debug)]
pub struct Config {
    pub native_infer: bool,
    /// The `Authorization` values that open inference; None: open.
    pub auth: Option<Vec<Vec<u8>>>,
    pub hosts: HostPolicy,
    pub max_url_bytes: usize,
    pub max_header_bytes: usize,
    pub header_timeout: Duration,
    pub header_timeout_s: f64,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub body_timeout: Duration,
    pub body_timeout_s: f64,
    /// Bytes per second a body must bring over each `body_timeout` window; see `pace`.
    pub body_min_rate_bytes_s: u64,
    pub max_request_bytes: usize,
    pub native_body_bytes: usize,
    pub max_pending: usize,
    pub http_bridge: Option<String>,
    pub grpc_bridge: Option<String>,
    pub grpc_max_connections: Option<usize>,
    pub grpc_idle_timeout: Duration,
    pub grpc_handshake_timeout: Duration,
    pub grpc_keepalive_time: Duration,
    pub grpc_keepalive_timeout: Duration,
    /// A client's pings may come this often; see `pings`.
    pub grpc_min_ping_interval: Duration,
    pub grpc_max_concurrent_streams: Option<u32>,
    pub grpc_max_message_bytes: usize,
}

impl Default for Config {
    /// The bounds `corral serve` uses by default, no bridges (for tests and tools).
    fn default() -> Self {
        Self {
            native_infer: true,
            auth: None,
            hosts: HostPolicy::default_any(),
            max_url_bytes: 8192,
            max_header_bytes: 65536,
            header_timeout: Duration::from_secs(10),
            header_timeout_s: 10.0,
            idle_timeout: Duration::from_secs(5),
            max_connections: 1000,
            body_timeout: Duration::from_secs(30),
            body_timeout_s: 30.0,
            body_min_rate_bytes_s: 1024,
            max_request_bytes: 64 << 20,
            native_body_bytes: 1 << 20,
            max_pending: 4096,
            http_bridge: None,
            grpc_bridge: None,
            grpc_max_connections: None,
            grpc_idle_timeout: Duration::from_secs(60),
            grpc_handshake_timeout: Duration::from_secs(10),
            grpc_keepalive_time: Duration::from_secs(60),
            grpc_keepalive_timeout: Duration::from_secs(20),
            grpc_min_ping_interval: Duration::from_secs(10),
            grpc_max_concurrent_streams: None,
            grpc_max_message_bytes: 64 << 20,
        }
    }
}

/// Which protocol a call came by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

/// An answer to a call, made by Python (or by the edge for a dropped call).
#[derive(Debug)]
pub enum Answer {
    /// Header lines after the defaults (content-type, content-length, extra), and the body.
    Http {
        status: u16,
        lines: Vec<u8>,
        body: Vec<u8>,
    },
    /// `code` 0 with a serialized ModelInferResponse; else a status and its message.
    Grpc {
        code: u32,
        message: String,
        body: Option<Vec<u8>>,
    },
    /// No answer from Python: the request goes to the Python edge as it came, which answers
    /// it (a model to load first, an answer only Python's encoder makes).
    Bridge,
}

/// The answer to a call that never got one from Python.
pub const DROPPED: &str = "the server dropped this request without an answer";

/// Where a call's answer goes: the connection waiting for it.
pub type Reply = oneshot::Sender<Answer>;

/// A call handed off and not yet taken by Python.
#[derive(Debug)]
pub struct Pending {
    pub model: String,
    pub version: Option<String>,
    pub protocol: Protocol,
    pub request: PlainRequest,
    pub timeout_us: Option<u64>,
    pub received: Instant,
    pub reply: Reply,
    pub held: Held,
}

/// The pending calls: the edge's threads push, Python's `take` drains them all at once.
pub struct Queue {
    /// The calls in arrival order, whether the edge stopped (wakes every taker), and
    /// whether a taker was nudged (a notice waits: `take` returns, maybe with no call).
    pending_lock: Mutex<(VecDeque<Pending>, bool, bool)>,
    ready: Condvar,
    limit: usize,
}

impl Queue {
    pub fn new(limit: usize) -> Self {
        Self {
            pending_lock: Mutex::new((VecDeque::new(), false, false)),
            ready: Condvar::new(),
            limit,
        }
    }

    /// Hands a call off; gives it back if `max_pending` calls wait already.
    #[allow(clippy::result_large_err)] // handed straight back to the caller, never stored
    pub fn push(&self, call: Pending) -> Result<(), Pending> {
        let mut state = self.pending_lock.lock();
        if state.0.len() >= self.limit {
            return Err(call);
        }
        state.0.push_back(call);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Every pending call, waiting up to `timeout` for the first.
    pub fn take(&self, timeout: Duration) -> Vec<Pending> {
        let deadline = Instant::now() + timeout;
        let mut state = self.pending_lock.lock();
        while state.0.is_empty() && !state.1 && !state.2 {
            if self.ready.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        state.2 = false;
        state.0.drain(..).collect()
    }

    /// Every pending call, without waiting (none: empty).
    pub fn try_take(&self) -> Vec<Pending> {
        let mut state = self.pending_lock.lock();
        if state.0.is_empty() {
            return Vec::new();
        }
        state.0.drain(..).collect()
    }

    /// Removes every pending call (the drain ran out, or the edge stops).
    pub fn clear(&self) -> Vec<Pending> {
        self.pending_lock.lock().0.drain(..).collect()
    }

    /// Wakes a taker now, with or without calls (a notice waits to be logged).
    pub fn nudge(&self) {
        self.pending_lock.lock().2 = true;
        self.ready.notify_one();
    }

    /// Wakes every taker for good (the edge stopped).
    pub fn close(&self) {
        self.pending_lock.lock().1 = true;
        self.ready.notify_all();
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// Counters (`Edge.stats()`); they only go up. (The connections open are counted by
/// `Shared::slots` and `Shared::grpc_open`.)
#[derive(Debug, Default)]
pub struct Stats {
    /// gRPC connections accepted.
    pub grpc_accepted: AtomicU64,
    pub native: AtomicU64,
    pub bridged: AtomicU64,
    pub refused_pending: AtomicU64,
    pub panics: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub cut: AtomicU64,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Python's logging levels, for [`Notices`].
pub const INFO: u8 = 20;
pub const WARNING: u8 = 30;
/// Notices kept until Python takes them; past this they are counted, not kept.
const NOTICES_KEPT: usize = 1024;

/// What the edge has to say in corral's log, in the Python edge's words: (level, text),
/// taken by the dispatcher (`Edge.notices()`) each time it takes calls.
#[derive(Debug, Default)]
pub struct Notices {
    /// The notices not yet taken, oldest first.
    said_lock: Mutex<VecDeque<(u8, String)>>,
    /// Notices dropped because `NOTICES_KEPT` were waiting.
    pub dropped: AtomicU64,
}

impl Notices {
    /// Keeps a notice for Python's log (counts it as dropped if too many wait).
    pub fn say(&self, level: u8, text: String) {
        let mut said = self.said_lock.lock();
        if said.len() >= NOTICES_KEPT {
            drop(said);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        said.push_back((level, text));
    }

    /// Every notice kept, oldest first; none are kept after.
    pub fn take(&self) -> Vec<(u8, String)> {
        self.said_lock.lock().drain(..).collect()
    }
}

/// An open HTTP connection as the cap and the drain see it.
#[derive(Debug, Default)]
pub struct Slot {
    /// Waiting for a request's first byte (an idle connection may be closed for room).
    pub idle: AtomicBool,
    /// Told to close when idle, by the drain.
    pub close: Notify,
    /// Asked to close for room by a connection past the cap (see `http1::make_room`).
    pub room_asked: Notify,
    /// Where the asked connection says whether it closed (true) or had a request (false).
    pub verdict_lock: Mutex<Option<oneshot::Sender<bool>>>,
}

/// An open gRPC connection as the cap sees it (see `grpc::make_room`).
#[derive(Debug)]
pub struct GrpcPlace {
    /// Calls in flight on it: one with any is never closed for room.
    pub active: AtomicUsize,
    /// When it was accepted or its last call ended: the oldest idle one is closed first.
    pub last_change: Mutex<Instant>,
    /// A call was made on it: one that never made any is closed for room first.
    pub called: AtomicBool,
    /// Asked to close for room already (each is asked once).
    pub room_asked: AtomicBool,
    /// Wakes it to close for room: GOAWAY if it has no call by then.
    pub close_for_room: Notify,
}

impl GrpcPlace {
    pub fn new(now: Instant) -> Self {
        Self {
            active: AtomicUsize::new(0),
            last_change: Mutex::new(now),
            called: AtomicBool::new(false),
            room_asked: AtomicBool::new(false),
            close_for_room: Notify::new(),
        }
    }
}

/// One-way signals that wake every waiter, also those that begin to wait afterwards.
#[derive(Debug, Default)]
pub struct Signal {
    raised: AtomicBool,
    notify: Notify,
}

impl Signal {
    pub fn raise(&self) {
        self.raised.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// Completes once raised.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }
}

/// A model name whose native requests panic (a test hook: `corral_edge._panic_on_model`).
pub static PANIC_MODEL: Mutex<Option<String>> = Mutex::new(None);

/// The state one Edge's threads share.
pub struct Shared {
    pub config: Config,
    pub budget: Arc<Budget>,
    pub queue: Queue,
    pub stats: Stats,
    pub notices: Notices,
    pub dates: crate::text::DateCache,
    /// Open HTTP connections (for the cap and the drain), by id.
    pub slots: Mutex<Vec<(u64, Arc<Slot>)>>,
    pub next_slot: AtomicU64,
    /// The drain began: answers say `Connection: close`, idle connections close.
    pub draining: Signal,
    /// The drain ran out: what is still waiting is answered 503 / UNAVAILABLE.
    pub cut: Signal,
    /// The edge stops: every connection ends now.
    pub stopping: Signal,
    /// Open gRPC connections.
    pub grpc_open: AtomicUsize,
    /// The open gRPC connections' places, by id (for the cap: see `grpc::make_room`).
    pub grpc_places: Mutex<Vec<(u64, Arc<GrpcPlace>)>>,
    /// The HTTP bridge's idle connections.
    pub http_pool: Mutex<Vec<(tokio::net::UnixStream, Instant)>>,
}

impl Shared {
    pub fn new(config: Config, budget: Arc<Budget>) -> Self {
        let max_pending = config.max_pending;
        Self {
            config,
            budget,
            queue: Queue::new(max_pending),
            stats: Stats::default(),
            notices: Notices::default(),
            dates: crate::text::DateCache::default(),
            slots: Mutex::new(Vec::new()),
            next_slot: AtomicU64::new(0),
            draining: Signal::default(),
            cut: Signal::default(),
            stopping: Signal::default(),
            grpc_open: AtomicUsize::new(0),
            grpc_places: Mutex::new(Vec::new()),
            http_pool: Mutex::new(Vec::new()),
        }
    }

    /// Keeps a notice for corral's log and wakes the dispatcher to log it now, rather than
    /// when the next call or the take's timeout wakes it.
    pub fn say(&self, level: u8, text: String) {
        self.notices.say(level, text);
        self.queue.nudge();
    }

    /// Panics if `model` is the test hook's (see `_panic_on_model`).
    pub fn maybe_panic(&self, model: &str) {
        let armed = PANIC_MODEL.lock().as_deref() == Some(model);
        if armed {
            panic!("the test hook's panic for model {model:?}");
        }
    }
}

/// The message of a caught panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic".to_string()
    }
}

/// A future whose panic is caught and returned as an error (one request's panic answers that
/// request, and the connection and the process go on).
pub struct CatchUnwind<F>(pub F);

impl<F: std::future::Future + Unpin> std::future::Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::pin::Pin::new(inner).poll(cx)
        })) {
            Ok(std::task::Poll::Ready(value)) => std::task::Poll::Ready(Ok(value)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(payload) => std::task::Poll::Ready(Err(panic_text(payload.as_ref()))),
        }
    }
}
