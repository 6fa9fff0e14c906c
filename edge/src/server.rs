//! The accept loops and the drain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use crate::http1;
use crate::shared::Shared;

/// Accepts HTTP connections until the drain (or the stop) begins; the listener then closes.
pub async fn accept_http(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.draining.wait() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(_) => {
                // Out of file descriptors, say: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (id, slot, refused) = http1::admit(&shared);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let place = http1::Admitted {
                shared: Arc::clone(&shared),
                id,
            };
            let stopping = Arc::clone(&shared);
            tokio::select! {
                () = http1::serve(stream, peer, place, slot, refused) => {}
                () = stopping.stopping.wait() => {}
            }
        });
    }
}

/// Drains the edge (see `Edge.drain`): returns how many requests were cut.
pub fn drain(shared: &Shared, in_flight: &AtomicUsize, timeout: Duration) -> usize {
    let cut_before = shared.stats.cut.load(Ordering::SeqCst);
    shared.draining.raise();
    for (_, slot) in shared.slots.lock().iter() {
        slot.close.notify_one();
    }
    let deadline = Instant::now() + timeout;
    let settled = || {
        shared.slots.lock().is_empty()
            && shared.grpc_open.load(Ordering::SeqCst) == 0
            && in_flight.load(Ordering::SeqCst) == 0
    };
    // The drain is rare and bounded: looked at every few milliseconds.
    while !settled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if !settled() {
        shared.cut.raise();
        drop(shared.queue.clear());
        let grace = Instant::now() + Duration::from_secs(1);
        while !(shared.slots.lock().is_empty() && shared.grpc_open.load(Ordering::SeqCst) == 0)
            && Instant::now() < grace
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    usize::try_from(shared.stats.cut.load(Ordering::SeqCst) - cut_before).unwrap_or(usize::MAX)
}
