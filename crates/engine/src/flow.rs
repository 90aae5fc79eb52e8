//! Flow control an operator sets on a queue's workflow or activity tasks: a dispatch rate with a
//! burst (a token bucket), and a cap on tasks leased at once. The store keeps each queue's limits
//! and bucket in one row, locked by every claim of that queue, so nodes sharing a database
//! never exceed a limit together; this is the arithmetic.

use crate::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const RATE_PER_SECOND_MAX: f64 = 1_000_000.0;
pub const BURST_MAX: u32 = 1_000_000;
pub const LEASED_MAX: u32 = 1_000_000;
/// How soon a poller held back by the leased-task cap looks again (a lease ending wakes nobody).
pub const LEASED_RECHECK_MS: i64 = 250;

/// What an operator set on one queue and task kind; `None`: no such limit. The first three
/// hold the queue as a whole; the fairness-key settings hold each key (a fairness class,
/// `scheduling::DEFAULT_CLASS` for runs started without one) on its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// Leases per second, on average.
    pub dispatch_rate_per_second: Option<f64>,
    /// Leases allowed at once after a quiet spell; the rate rounded up when not set.
    pub dispatch_burst: Option<u32>,
    /// Tasks of the queue leased at once, at most.
    pub max_leased_tasks: Option<u32>,
    /// The limits every fairness key of the queue gets unless it has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key_limits: Option<KeyLimits>,
    /// Named fairness keys' own limits, in place of the default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fairness_key_overrides: BTreeMap<String, KeyLimits>,
    /// Named fairness keys' weights, in place of the weight their runs were started with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fairness_weights: BTreeMap<String, u16>,
    /// An operator's hold on the queue's tasks of this kind: none is leased until it is resumed
    /// (`docs/pause.md`). Kept with the limits; setting or clearing limits leaves it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::PauseRecord>,
}

/// One fairness key's limits: a dispatch rate with a burst, a cap on its tasks leased at once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyLimits {
    pub dispatch_rate_per_second: Option<f64>,
    pub dispatch_burst: Option<u32>,
    pub max_leased_tasks: Option<u32>,
}

/// A rate with a burst and a cap: the queue's own, or a fairness key's.
pub trait Limit {
    fn rate(&self) -> Option<f64>;
    fn burst_given(&self) -> Option<u32>;
    fn cap(&self) -> Option<u32>;

    /// The bucket's size.
    fn burst(&self) -> f64 {
        match (self.burst_given(), self.rate()) {
            (Some(burst), _) => f64::from(burst),
            (None, Some(rate)) => rate.ceil().max(1.0),
            (None, None) => 0.0,
        }
    }

    /// A full bucket: a limit starts by allowing its burst.
    fn full(&self, now: Millis) -> Bucket {
        Bucket {
            tokens: self.burst(),
            refilled_at: now,
        }
    }
}

/// [`Limit`] for a type with the three fields under their API names.
macro_rules! limit_fields {
    ($($limits:ty),*) => {$(
        impl Limit for $limits {
            fn rate(&self) -> Option<f64> {
                self.dispatch_rate_per_second
            }
            fn burst_given(&self) -> Option<u32> {
                self.dispatch_burst
            }
            fn cap(&self) -> Option<u32> {
                self.max_leased_tasks
            }
        }
    )*};
}
limit_fields!(QueueLimits, KeyLimits);

/// The first of a rate, burst and cap out of bounds (`prefix` names where they sit).
fn check_limit(limit: &impl Limit, prefix: &str) -> Result<(), (String, String)> {
    let field = |name: &str| format!("{prefix}{name}");
    if let Some(rate) = limit.rate() {
        if !(rate > 0.0 && rate <= RATE_PER_SECOND_MAX) {
            let name = field("dispatch_rate_per_second");
            return Err((name.clone(), format!("{name} must be above 0 and at most {RATE_PER_SECOND_MAX}.")));
        }
    }
    if let Some(burst) = limit.burst_given() {
        let name = field("dispatch_burst");
        if !(1..=BURST_MAX).contains(&burst) {
            return Err((name.clone(), format!("{name} must be 1 to {BURST_MAX}.")));
        }
        if limit.rate().is_none() {
            return Err((name.clone(), format!("{name} needs a dispatch_rate_per_second beside it.")));
        }
    }
    if let Some(leased) = limit.cap() {
        if !(1..=LEASED_MAX).contains(&leased) {
            let name = field("max_leased_tasks");
            return Err((name.clone(), format!("{name} must be 1 to {LEASED_MAX}.")));
        }
    }
    Ok(())
}

impl KeyLimits {
    pub fn is_empty(&self) -> bool {
        self.dispatch_rate_per_second.is_none() && self.max_leased_tasks.is_none()
    }
}

impl QueueLimits {
    /// The first field out of bounds, with why. Fairness keys must be normalised already
    /// (`scheduling::fairness_key`, or the default class).
    pub fn check(&self) -> Result<(), (String, String)> {
        check_limit(self, "")?;
        if let Some(default) = &self.fairness_key_limits {
            check_limit(default, "fairness_key_limits.")?;
            if default.is_empty() {
                let message = "fairness_key_limits needs a dispatch_rate_per_second or a max_leased_tasks.";
                return Err(("fairness_key_limits".into(), message.into()));
            }
        }
        for (key, limits) in &self.fairness_key_overrides {
            check_limit(limits, &format!("fairness_key_overrides.{key}."))?;
        }
        for (key, weight) in &self.fairness_weights {
            if !(crate::scheduling::FAIRNESS_WEIGHT_MIN..=crate::scheduling::FAIRNESS_WEIGHT_MAX).contains(weight) {
                let name = format!("fairness_weights.{key}");
                return Err((name.clone(), format!("{name} must be 1 to 1000.")));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.dispatch_rate_per_second.is_none()
            && self.max_leased_tasks.is_none()
            && self.fairness_key_limits.is_none()
            && self.fairness_key_overrides.is_empty()
            && self.fairness_weights.is_empty()
            && self.paused.is_none()
    }

    /// The limits a fairness class is held to, if any: its own, else the default. A key's own
    /// entry with no limit in it frees the key from the default.
    pub fn of_key(&self, class: &str) -> Option<&KeyLimits> {
        match self.fairness_key_overrides.get(class) {
            Some(own) => (!own.is_empty()).then_some(own),
            None => self.fairness_key_limits.as_ref(),
        }
    }

    /// Whether any fairness key is limited.
    pub fn limits_keys(&self) -> bool {
        self.fairness_key_limits.is_some() || self.fairness_key_overrides.values().any(|l| !l.is_empty())
    }

    /// The weight an operator gave a fairness class, if any.
    pub fn weight_of(&self, class: &str) -> Option<u16> {
        self.fairness_weights.get(class).copied()
    }
}

/// A queue's buckets: its own, and each rate-limited fairness key's (as stored: an old row holds
/// the queue's alone).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buckets {
    #[serde(flatten)]
    pub queue: Bucket,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, Bucket>,
}

impl Buckets {
    /// A fairness key's bucket as of `now` (full when the key has not dispatched under its rate).
    pub fn key(&self, limit: &KeyLimits, class: &str, now: Millis) -> Bucket {
        match self.keys.get(class) {
            Some(bucket) => refill(limit, *bucket, now),
            None => limit.full(now),
        }
    }

    /// Drops the key buckets that say nothing an absent one does not (refilled to their burst by
    /// `now`, or no longer rate-limited), so the row holds only keys dispatching lately, not
    /// every tenant ever seen.
    pub fn prune(&mut self, limits: &QueueLimits, now: Millis) {
        self.keys.retain(|class, bucket| {
            limits
                .of_key(class)
                .filter(|limit| limit.rate().is_some())
                .is_some_and(|limit| refill(limit, *bucket, now).tokens < limit.burst())
        });
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
    /// The fairness key's dispatch rate is spent.
    KeyRate,
    /// As many of the fairness key's tasks are leased as its cap allows.
    KeyLeased,
    /// An operator paused the queue's tasks of this kind.
    Paused,
}

impl Held {
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Rate => "dispatch_rate",
            Held::Leased => "max_leased_tasks",
            Held::KeyRate => "fairness_key_dispatch_rate",
            Held::KeyLeased => "fairness_key_max_leased_tasks",
            Held::Paused => "paused",
        }
    }
}

/// Whether one more lease may go out now with `leased` tasks out: the bucket refilled to `now`,
/// and either yes or why not and how soon to look again. A fairness key's limits answer `Rate`
/// or `Leased` too; the store names them the key's (`Held::KeyRate`, `Held::KeyLeased`).
pub fn admit(limits: &impl Limit, bucket: Bucket, leased: u64, now: Millis) -> (Bucket, Result<(), (Held, i64)>) {
    let bucket = refill(limits, bucket, now);
    if limits.cap().is_some_and(|cap| leased >= u64::from(cap)) {
        return (bucket, Err((Held::Leased, LEASED_RECHECK_MS)));
    }
    if let Some(rate) = limits.rate() {
        if bucket.tokens < 1.0 {
            // Less a hair, so float noise does not round a whole millisecond up.
            let wait = ((1.0 - bucket.tokens) * 1000.0 / rate - 1e-6).ceil() as i64;
            return (bucket, Err((Held::Rate, wait.max(1))));
        }
    }
    (bucket, Ok(()))
}

/// The bucket after one lease went out; `None` without a rate (nothing to pay, nothing to keep).
pub fn spend(limits: &impl Limit, bucket: Bucket) -> Option<Bucket> {
    limits.rate().map(|_| Bucket {
        tokens: bucket.tokens - 1.0,
        ..bucket
    })
}

/// The bucket as of `now`: refilled at the rate since it was last written, up to the burst.
pub fn refill(limits: &impl Limit, bucket: Bucket, now: Millis) -> Bucket {
    let Some(rate) = limits.rate() else {
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
            ..QueueLimits::default()
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

    #[test]
    fn a_fairness_key_has_its_own_limits_or_the_default() {
        let cap = |n| KeyLimits {
            max_leased_tasks: Some(n),
            ..KeyLimits::default()
        };
        let limits = QueueLimits {
            fairness_key_limits: Some(cap(2)),
            fairness_key_overrides: [("big".to_string(), cap(10)), ("free".to_string(), KeyLimits::default())].into(),
            fairness_weights: [("big".to_string(), 3)].into(),
            ..QueueLimits::default()
        };
        assert!(limits.check().is_ok());
        assert!(limits.limits_keys());
        assert_eq!(limits.of_key("small"), Some(&cap(2)));
        assert_eq!(limits.of_key("big"), Some(&cap(10)));
        assert_eq!(limits.of_key("free"), None, "an empty override frees the key");
        assert_eq!((limits.weight_of("big"), limits.weight_of("small")), (Some(3), None));
        assert_eq!(admit(&cap(2), cap(2).full(0), 2, 0).1, Err((Held::Leased, LEASED_RECHECK_MS)));
    }

    #[test]
    fn fairness_key_settings_are_checked_by_name() {
        let bad_rate = QueueLimits {
            fairness_key_overrides: [(
                "t1".to_string(),
                KeyLimits {
                    dispatch_rate_per_second: Some(-1.0),
                    ..KeyLimits::default()
                },
            )]
            .into(),
            ..QueueLimits::default()
        };
        assert_eq!(
            bad_rate.check().unwrap_err().0,
            "fairness_key_overrides.t1.dispatch_rate_per_second"
        );
        let bad_weight = QueueLimits {
            fairness_weights: [("t1".to_string(), 0)].into(),
            ..QueueLimits::default()
        };
        assert_eq!(bad_weight.check().unwrap_err().0, "fairness_weights.t1");
        let empty_default = QueueLimits {
            fairness_key_limits: Some(KeyLimits::default()),
            ..QueueLimits::default()
        };
        assert_eq!(empty_default.check().unwrap_err().0, "fairness_key_limits");
    }

    #[test]
    fn a_stored_bucket_from_before_key_buckets_reads_as_the_queues() {
        let old: Buckets = serde_json::from_str(r#"{"tokens":2.5,"refilled_at":7}"#).unwrap();
        assert_eq!(
            old.queue,
            Bucket {
                tokens: 2.5,
                refilled_at: 7
            }
        );
        assert!(old.keys.is_empty());
        let key = KeyLimits {
            dispatch_rate_per_second: Some(4.0),
            ..KeyLimits::default()
        };
        assert_eq!(old.key(&key, "t1", 100).tokens, 4.0, "a key not seen yet starts full");
    }

    #[test]
    fn key_buckets_refilled_to_their_burst_are_dropped() {
        let limits = QueueLimits {
            fairness_key_limits: Some(KeyLimits {
                dispatch_rate_per_second: Some(1.0),
                dispatch_burst: Some(2),
                max_leased_tasks: None,
            }),
            ..QueueLimits::default()
        };
        let spent = Bucket {
            tokens: 0.0,
            refilled_at: 0,
        };
        let mut buckets = Buckets {
            queue: spent,
            keys: [
                (
                    "busy".to_string(),
                    Bucket {
                        tokens: 0.0,
                        refilled_at: 1_000,
                    },
                ),
                ("idle".to_string(), spent),
            ]
            .into(),
        };
        buckets.prune(&limits, 2_000);
        assert_eq!(
            buckets.keys.keys().collect::<Vec<_>>(),
            ["busy"],
            "idle is full again: as good as absent"
        );
        buckets.prune(&QueueLimits::default(), 2_000);
        assert!(buckets.keys.is_empty(), "no key is rate-limited any more");
    }
}
