//! A limit on requests in flight that follows their latency, the way TCP Vegas follows a
//! path's delay: every window, if even the fastest request of the window took more than
//! `TOLERANCE` times the lowest latency lately seen, the limit shrinks by a tenth; if not, and
//! the limit was nearly reached, it grows by a step.
//!
//! The fastest request, not the average: a stall (a checkpoint, a slow fsync) slows every
//! request in flight during it, but the ones after it are fast again, so a burst is not taken
//! for congestion; when every request of a window waits, the server is past what it can do.
//! A server that waits for its CPU rather than its writes' queue is bent by this: the work it
//! admits stays near what it can do, the rest is refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_millis(100);
const TOLERANCE: f64 = 3.0;
const MIN_LIMIT: f64 = 16.0;
const MAX_LIMIT: f64 = 4096.0;
const INITIAL_LIMIT: f64 = 64.0;
/// How fast the lowest latency forgets (per window), so the limit follows a slower disk.
const BASELINE_DRIFT: f64 = 1.002;

#[derive(Debug)]
pub struct InflightLimit {
    inflight: AtomicUsize,
    /// `State::limit` as a whole number, read without the lock on every request.
    current: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: f64,
    /// The lowest fastest-of-a-window latency lately seen: what an uncongested request takes.
    baseline: Option<Duration>,
    window_started: Instant,
    fastest: Option<Duration>,
    /// The most requests in flight at once during the window.
    busiest: usize,
}

impl Default for InflightLimit {
    fn default() -> Self {
        Self {
            inflight: AtomicUsize::new(0),
            current: AtomicUsize::new(INITIAL_LIMIT as usize),
            state: Mutex::new(State {
                limit: INITIAL_LIMIT,
                baseline: None,
                window_started: Instant::now(),
                fastest: None,
                busiest: 0,
            }),
        }
    }
}

/// One admitted request; dropping it (however the request ends) gives its place back.
pub struct Permit<'a> {
    limit: &'a InflightLimit,
    started: Instant,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limit.inflight.fetch_sub(1, Ordering::AcqRel);
        self.limit.record(self.started.elapsed(), Instant::now());
    }
}

impl InflightLimit {
    /// A place for one more request, or `None` when the limit is reached.
    pub fn try_acquire(&self) -> Option<Permit<'_>> {
        let limit = self.current.load(Ordering::Acquire);
        let admitted = self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()?;
        let mut state = self.state.lock().expect("inflight limit");
        state.busiest = state.busiest.max(admitted + 1);
        Some(Permit {
            limit: self,
            started: Instant::now(),
        })
    }

    pub fn limit(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    fn record(&self, latency: Duration, now: Instant) {
        let mut state = self.state.lock().expect("inflight limit");
        let fastest = state.fastest.map_or(latency, |f| f.min(latency));
        if now.duration_since(state.window_started) < WINDOW {
            state.fastest = Some(fastest);
            return;
        }
        let baseline = state.baseline.map_or(fastest, |b| b.mul_f64(BASELINE_DRIFT).min(fastest));
        state.baseline = Some(baseline);
        if fastest.as_secs_f64() > baseline.as_secs_f64() * TOLERANCE {
            state.limit = (state.limit * 0.9).max(MIN_LIMIT);
        } else if state.busiest as f64 >= state.limit * 0.8 {
            state.limit = (state.limit + 2.0).min(MAX_LIMIT);
        }
        self.current.store(state.limit as usize, Ordering::Release);
        state.window_started = now;
        state.fastest = None;
        state.busiest = self.inflight.load(Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_windows_shrink_the_limit_fast_ones_at_the_limit_grow_it_and_a_stall_does_not_count() {
        let limit = InflightLimit::default();
        let start = Instant::now();
        let window = |n: u64| start + WINDOW * (n as u32 + 1);
        // Fast windows, with the limit reached: it grows.
        for n in 0..5 {
            limit.state.lock().unwrap().busiest = 64;
            limit.record(Duration::from_millis(2), window(n));
        }
        let grown = limit.limit();
        assert!(grown > 64, "{grown}");
        // A stall: slow requests, but one of the window went straight through.
        for n in 5..20 {
            limit.record(Duration::from_millis(40), window(n) - WINDOW / 2);
            limit.record(Duration::from_millis(2), window(n));
        }
        assert!(limit.limit() >= grown, "a stall shrank the limit to {}", limit.limit());
        // Every request five times slower: it shrinks, window by window, to its floor at most.
        let before = limit.limit();
        for n in 20..80 {
            limit.record(Duration::from_millis(10), window(n));
        }
        assert!(limit.limit() < before / 4, "{} from {before}", limit.limit());
        assert!(limit.limit() >= MIN_LIMIT as usize);
        // Places: the limit is a hard bound.
        let places: Vec<_> = (0..limit.limit()).map(|_| limit.try_acquire().unwrap()).collect();
        assert!(limit.try_acquire().is_none());
        drop(places);
        assert!(limit.try_acquire().is_some());
    }
}
