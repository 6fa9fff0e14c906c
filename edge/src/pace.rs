//! A request body held to progress: silence and a minimum rate, the Python edge's two rules
//! (`corral.server.connections.body`).
//!
//! A body may go `body_timeout` without a byte; and over each window of `body_timeout` from
//! its first read it must bring `body_min_rate_bytes_s` x `body_timeout_s` bytes. A body that
//! slows down is cut at the end of the next window at the latest, so the budget bytes it
//! holds are given back within two timeouts of it slowing down, whatever it sends.

use std::time::{Duration, Instant};

use crate::shared::Config;
use crate::text::fmt_g;

/// Why a body was cut.
#[derive(Debug, PartialEq, Eq)]
pub enum Slow {
    /// No byte for the timeout.
    Silent,
    /// This many bytes in the last window: under the rate.
    UnderRate(u64),
}

/// One body's clocks: the time since its last byte and the bytes of its current window.
#[derive(Debug)]
pub struct Pace {
    window: Duration,
    /// The bytes each window must bring (0: the rate is not held).
    window_min: u64,
    last_byte: Instant,
    window_end: Instant,
    window_bytes: u64,
}

impl Pace {
    /// A body whose head is complete at `now`, held to `config`'s timeout and rate.
    pub fn new(config: &Config, now: Instant) -> Self {
        let window_min = (config.body_min_rate_bytes_s as f64 * config.body_timeout_s).ceil();
        Self {
            window: config.body_timeout,
            window_min: window_min as u64,
            last_byte: now,
            window_end: now + config.body_timeout,
            window_bytes: 0,
        }
    }

    /// When to look again: the first of the silence's end and the window's end.
    pub fn deadline(&self) -> Instant {
        (self.last_byte + self.window).min(self.window_end)
    }

    /// `n` bytes arrived at `now`.
    pub fn arrived(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.last_byte = now;
            self.window_bytes += n as u64;
        }
    }

    /// At `deadline()` (or later): Err if the body is cut; else the next window begins if this
    /// one ended.
    pub fn check(&mut self, now: Instant) -> Result<(), Slow> {
        if now.duration_since(self.last_byte) >= self.window {
            return Err(Slow::Silent);
        }
        if now >= self.window_end {
            if self.window_bytes < self.window_min {
                return Err(Slow::UnderRate(self.window_bytes));
            }
            self.window_end = now + self.window;
            self.window_bytes = 0;
        }
        Ok(())
    }
}

/// The text of a body cut for `slow`: the Python edge's own words.
pub fn slow_text(slow: &Slow, config: &Config) -> String {
    let timeout = fmt_g(config.body_timeout_s);
    match slow {
        Slow::Silent => {
            format!("the request's body stopped arriving: no byte for {timeout} s (body_timeout_s)")
        }
        Slow::UnderRate(bytes) => format!(
            "the request's body arrived too slowly: {bytes} bytes in {timeout} s \
             (body_timeout_s), under the {} bytes/s it must keep (body_min_rate_bytes_s)",
            config.body_min_rate_bytes_s
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rate: u64) -> Config {
        Config {
            body_timeout: Duration::from_secs(3),
            body_timeout_s: 3.0,
            body_min_rate_bytes_s: rate,
            ..Config::default()
        }
    }

    /// A byte every 200 ms from `start` until cut; the time it ran.
    fn trickle(pace: &mut Pace, start: Instant) -> Result<Duration, Duration> {
        let step = Duration::from_millis(200);
        let mut now = start;
        for _ in 0..1000 {
            let next = now + step;
            while pace.deadline() <= next {
                let at = pace.deadline();
                if let Err(slow) = pace.check(at) {
                    assert!(matches!(slow, Slow::UnderRate(_)), "{slow:?}");
                    return Ok(at - start);
                }
            }
            now = next;
            pace.arrived(1, now);
        }
        Err(now - start)
    }

    #[test]
    fn a_trickled_body_is_cut_as_its_first_window_ends() {
        let start = Instant::now();
        let mut pace = Pace::new(&config(1024), start);
        assert_eq!(trickle(&mut pace, start), Ok(Duration::from_secs(3)));
        let text = slow_text(&Slow::UnderRate(15), &config(1024));
        assert_eq!(
            text,
            "the request's body arrived too slowly: 15 bytes in 3 s (body_timeout_s), \
             under the 1024 bytes/s it must keep (body_min_rate_bytes_s)"
        );
    }

    #[test]
    fn a_fast_start_then_a_trickle_is_cut_by_the_next_window() {
        let start = Instant::now();
        let mut pace = Pace::new(&config(1024), start);
        pace.arrived(1 << 20, start);
        assert_eq!(trickle(&mut pace, start), Ok(Duration::from_secs(6)));
    }

    #[test]
    fn a_body_keeping_the_rate_goes_on() {
        let start = Instant::now();
        let mut pace = Pace::new(&config(1024), start);
        for second in 1..=30 {
            let now = start + Duration::from_secs(second);
            pace.arrived(1100, now - Duration::from_millis(1));
            while pace.deadline() <= now {
                let at = pace.deadline();
                assert_eq!(pace.check(at), Ok(()));
            }
        }
    }

    #[test]
    fn silence_is_cut_and_a_rate_of_zero_cuts_only_silence() {
        let start = Instant::now();
        let mut pace = Pace::new(&config(0), start);
        assert!(trickle(&mut pace, start).is_err());
        let mut silent = Pace::new(&config(0), start);
        silent.arrived(10, start + Duration::from_secs(1));
        let at = silent.deadline();
        assert_eq!(at, start + Duration::from_secs(3));
        assert_eq!(silent.check(at), Ok(())); // the window's end: the rate is not held
        let at = silent.deadline();
        assert_eq!(at, start + Duration::from_secs(4));
        assert_eq!(silent.check(at), Err(Slow::Silent));
        assert!(slow_text(&Slow::Silent, &config(0)).contains("no byte for 3 s"));
    }
}
