//! How long writes wait before they run: the SQLite writer's queue (from a job's queueing to
//! its batch's start), or a shared database's connection pool (the wait for a connection).
//! Admission control reads it (`crates/server/src/admission/`).
//!
//! The measure is CoDel's: the smallest wait seen over a window. A burst that drains within
//! the window has one short wait in it and does not count; a standing queue (every write of a
//! whole window waited) does. A window with no write at all reads as no wait: a writer that
//! takes nothing has no queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window over which the smallest wait is taken.
pub const WINDOW: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct WriteDelay {
    window: Mutex<Window>,
    /// The last complete window's smallest wait, in microseconds.
    settled_us: AtomicU64,
    /// When that window ended, in microseconds since `origin`.
    settled_at_us: AtomicU64,
    origin: Instant,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    smallest: Option<Duration>,
}

impl Default for WriteDelay {
    fn default() -> Self {
        let origin = Instant::now();
        Self {
            window: Mutex::new(Window {
                started: origin,
                smallest: None,
            }),
            settled_us: AtomicU64::new(0),
            settled_at_us: AtomicU64::new(0),
            origin,
        }
    }
}

impl WriteDelay {
    /// A write waited this long before it ran.
    pub fn observe(&self, waited: Duration) {
        self.observe_at(waited, Instant::now());
    }

    fn observe_at(&self, waited: Duration, now: Instant) {
        let mut window = self.window.lock().expect("write delay window");
        if now.duration_since(window.started) >= WINDOW {
            let smallest = window.smallest.unwrap_or(waited).min(waited);
            self.settled_us.store(smallest.as_micros() as u64, Ordering::Relaxed);
            self.settled_at_us
                .store(now.duration_since(self.origin).as_micros() as u64, Ordering::Relaxed);
            *window = Window {
                started: now,
                smallest: None,
            };
        } else {
            window.smallest = Some(window.smallest.map_or(waited, |s| s.min(waited)));
        }
    }

    /// Fault injection for tests: reads as a standing queue of `standing` now (until the next
    /// window ends, or three windows pass without a write).
    pub fn inject(&self, standing: Duration) {
        self.settled_us.store(standing.as_micros() as u64, Ordering::Relaxed);
        self.settled_at_us
            .store(Instant::now().duration_since(self.origin).as_micros() as u64, Ordering::Relaxed);
        *self.window.lock().expect("write delay window") = Window {
            started: Instant::now(),
            smallest: None,
        };
    }

    /// The standing queue: the smallest wait of the last complete window, or nothing when no
    /// window ended lately (no write came to wait).
    pub fn standing(&self) -> Duration {
        self.standing_at(Instant::now())
    }

    fn standing_at(&self, now: Instant) -> Duration {
        let settled_at = self.origin + Duration::from_micros(self.settled_at_us.load(Ordering::Relaxed));
        if now.saturating_duration_since(settled_at) > WINDOW * 3 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.settled_us.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_that_drains_is_not_a_standing_queue_and_a_full_window_of_waits_is() {
        let delay = WriteDelay::default();
        let start = delay.origin;
        let at = |ms: u64| start + Duration::from_millis(ms);
        // A burst: long waits, but one write of the window went straight in.
        for (ms, waited) in [(10, 40), (20, 35), (30, 0), (40, 30)] {
            delay.observe_at(Duration::from_millis(waited), at(ms));
        }
        delay.observe_at(Duration::from_millis(25), at(110));
        assert_eq!(delay.standing_at(at(120)), Duration::ZERO);
        // A standing queue: every write of the next window waited at least 20 ms.
        for (ms, waited) in [(130, 25), (150, 20), (190, 60)] {
            delay.observe_at(Duration::from_millis(waited), at(ms));
        }
        delay.observe_at(Duration::from_millis(30), at(215));
        assert_eq!(delay.standing_at(at(220)), Duration::from_millis(20));
        // No write since: no queue.
        assert_eq!(delay.standing_at(at(600)), Duration::ZERO);
    }
}
