//! Flow control an operator sets on a queue's workflow or activity tasks: a dispatch rate with a
//! burst (a token bucket), and a cap on tasks leased at once. The store keeps each queue's limits
//! and bucket in one row, locked by every claim of that queue, so nodes sharing a database
//! never exceed a limit together; this is the arithmetic.

use crate::Millis;
use serde::{Deserialize, Serialize};

pub const RATE_PER_SECOND_MAX: f64 = 1_000_000.0;
pub const BURST_MAX: u32 = 1_000_000;
pub const LEASED_MAX: u32 = 1_000_000;
/// How soon a poller held back by the leased-task cap looks again (a lease ending wakes nobody).
pub const LEASED_RECHECK_MS: i64 = 250;

/// What an operator set on one queue and task kind; `None`: no such limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// Leases per second, on average.
    pub dispatch_rate_per_second: Option<f64>,
    /// Leases allowed at once after a quiet spell; the rate rounded up when not set.
    pub dispatch_burst: Option<u32>,
    /// Tasks of the queue leased at once, at most.
    pub max_leased_tasks: Option<u32>,
}

impl QueueLimits {
    /// The first field out of bounds, with why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(rate) = self.dispatch_rate_per_second {
            if !(rate > 0.0 && rate <= RATE_PER_SECOND_MAX) {
                return Err((
                    "dispatch_rate_per_second",
                    format!("dispatch_rate_per_second must be above 0 and at most {RATE_PER_SECOND_MAX}."),
                ));
            }
        }
        if let Some(burst) = self.dispatch_burst {
            if !(1..=BURST_MAX).contains(&burst) {
                return Err(("dispatch_burst", format!("dispatch_burst must be 1 to {BURST_MAX}.")));
            }
            if self.dispatch_rate_per_second.is_none() {
                return Err(("dispatch_burst", "dispatch_burst needs a dispatch_rate_per_second.".into()));
            }
        }
        if let Some(leased) = self.max_leased_tasks {
            if !(1..=LEASED_MAX).contains(&leased) {
                return Err(("max_leased_tasks", format!("max_leased_tasks must be 1 to {LEASED_MAX}.")));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.dispatch_rate_per_second.is_none() && self.max_leased_tasks.is_none()
    }

    /// The bucket's size.
    pub fn burst(&self) -> f64 {
        match (self.dispatch_burst, self.dispatch_rate_per_second) {
            (Some(burst), _) => f64::from(burst),
            (None, Some(rate)) => rate.ceil().max(1.0),
            (None, None) => 0.0,
        }
    }

    /// A full bucket: a limit starts by allowing its burst.
    pub fn full(&self, now: Millis) -> Bucket {
        Bucket {
            tokens: self.burst(),
            refilled_at: now,
        }
    }
}

/// A rate limit's bucket as of `refilled_at`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub tokens: f64,
    pub refilled_at: Millis,
}

/// Why a claim was held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The dispatch rate is spent until the next token.
    Rate,
    /// As many tasks are leased as the cap allows.
    Leased,
}

impl Held {
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Rate => "dispatch_rate",
            Held::Leased => "max_leased_tasks",
        }
    }
}

/// Whether one more lease may go out now with `leased` tasks out: the bucket refilled to `now`,
/// and either yes or why not and how soon to look again.
pub fn admit(limits: &QueueLimits, bucket: Bucket, leased: u64, now: Millis) -> (Bucket, Result<(), (Held, i64)>) {
    let bucket = refill(limits, bucket, now);
    if limits.max_leased_tasks.is_some_and(|cap| leased >= u64::from(cap)) {
        return (bucket, Err((Held::Leased, LEASED_RECHECK_MS)));
    }
    if let Some(rate) = limits.dispatch_rate_per_second {
        if bucket.tokens < 1.0 {
            // Less a hair, so float noise does not round a whole millisecond up.
            let wait = ((1.0 - bucket.tokens) * 1000.0 / rate - 1e-6).ceil() as i64;
            return (bucket, Err((Held::Rate, wait.max(1))));
        }
    }
    (bucket, Ok(()))
}

/// The bucket after one lease went out; `None` without a rate (nothing to pay, nothing to keep).
pub fn spend(limits: &QueueLimits, bucket: Bucket) -> Option<Bucket> {
    limits.dispatch_rate_per_second.map(|_| Bucket {
        tokens: bucket.tokens - 1.0,
        ..bucket
    })
}

/// The bucket as of `now`: refilled at the rate since it was last written, up to the burst.
pub fn refill(limits: &QueueLimits, bucket: Bucket, now: Millis) -> Bucket {
    let Some(rate) = limits.dispatch_rate_per_second else {
        return Bucket {
            tokens: 0.0,
            refilled_at: now,
        };
    };
    let elapsed = (now - bucket.refilled_at).max(0) as f64;
    Bucket {
        tokens: (bucket.tokens + elapsed * rate / 1000.0).min(limits.burst()),
        refilled_at: now.max(bucket.refilled_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: f64, burst: Option<u32>) -> QueueLimits {
        QueueLimits {
            dispatch_rate_per_second: Some(per_second),
            dispatch_burst: burst,
            max_leased_tasks: None,
        }
    }

    #[test]
    fn limits_are_checked() {
        assert!(rate(20.0, Some(5)).check().is_ok());
        assert_eq!(rate(0.0, None).check().unwrap_err().0, "dispatch_rate_per_second");
        assert_eq!(rate(f64::NAN, None).check().unwrap_err().0, "dispatch_rate_per_second");
        assert_eq!(rate(1.0, Some(0)).check().unwrap_err().0, "dispatch_burst");
        let burst_alone = QueueLimits {
            dispatch_burst: Some(3),
            ..QueueLimits::default()
        };
        assert_eq!(burst_alone.check().unwrap_err().0, "dispatch_burst");
        let no_cap = QueueLimits {
            max_leased_tasks: Some(0),
            ..QueueLimits::default()
        };
        assert_eq!(no_cap.check().unwrap_err().0, "max_leased_tasks");
    }

    #[test]
    fn a_burst_goes_out_then_the_rate_holds() {
        let limits = rate(20.0, Some(5));
        let mut bucket = limits.full(0);
        let mut leased_at = Vec::new();
        let mut now = 0;
        while now <= 10_000 {
            let (refilled, admitted) = admit(&limits, bucket, 0, now);
            bucket = refilled;
            match admitted {
                Ok(()) => {
                    bucket = spend(&limits, bucket).expect("a rate keeps a bucket");
                    leased_at.push(now);
                }
                Err((held, wait)) => {
                    assert_eq!(held, Held::Rate);
                    assert!(wait > 0 && wait <= 50, "{wait}");
                    now += wait;
                }
            }
        }
        assert_eq!(leased_at[..5], [0, 0, 0, 0, 0], "the burst at once");
        let total = leased_at.len();
        assert!(
            (5 + 200..=5 + 201).contains(&total),
            "{total} leases in 10 s at 20/s after a burst of 5"
        );
    }

    #[test]
    fn the_cap_holds_back_while_as_many_are_leased() {
        let limits = QueueLimits {
            max_leased_tasks: Some(2),
            ..QueueLimits::default()
        };
        let bucket = limits.full(0);
        assert_eq!(admit(&limits, bucket, 1, 0).1, Ok(()));
        assert_eq!(admit(&limits, bucket, 2, 0).1, Err((Held::Leased, LEASED_RECHECK_MS)));
    }

    #[test]
    fn an_idle_bucket_refills_only_to_its_burst() {
        let limits = rate(2.0, None);
        let (bucket, admitted) = admit(
            &limits,
            Bucket {
                tokens: 0.0,
                refilled_at: 0,
            },
            0,
            3_600_000,
        );
        assert_eq!(admitted, Ok(()));
        assert_eq!(bucket.tokens, 2.0);
        let (_, early) = admit(
            &limits,
            Bucket {
                tokens: 0.5,
                refilled_at: 0,
            },
            0,
            0,
        );
        assert_eq!(early, Err((Held::Rate, 250)));
    }
}
