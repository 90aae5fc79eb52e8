//! A run's place in dispatch: its priority and fairness class, as DW's task-queue priority and
//! fairness contract (`durable-workflow.v2.task-queue-priority-fairness.contract`, version 1)
//! defines them. A run's workflow and activity tasks carry its values; lower priority numbers
//! run first, and inside one priority the fairness classes share dispatch by weight
//! (`crate::fairness`).

use serde::{Deserialize, Serialize};

pub const PRIORITY_MIN: u8 = 0;
/// The lowest a user should ask for; 0 is kept for urgent control-plane work, yet accepted.
pub const PRIORITY_MIN_USER: u8 = 1;
pub const PRIORITY_MAX: u8 = 9;
pub const PRIORITY_DEFAULT: u8 = 5;
pub const FAIRNESS_WEIGHT_MIN: u16 = 1;
pub const FAIRNESS_WEIGHT_MAX: u16 = 1000;
pub const FAIRNESS_WEIGHT_DEFAULT: u16 = 1;
pub const FAIRNESS_KEY_MAX: usize = 64;
/// The class every task without a fairness key shares.
pub const DEFAULT_CLASS: &str = "__default__";

pub const PRIORITY_RANGE_MESSAGE: &str = "The priority field must be an integer in the range 0..9 (lower runs first).";
pub const FAIRNESS_KEY_MESSAGE: &str =
    "The fairness_key field must be 1-64 URL-safe characters using letters, numbers, \".\", \"_\", \"-\", or \":\".";
pub const FAIRNESS_WEIGHT_MESSAGE: &str = "The fairness_weight field must be an integer in the range 1..1000.";

/// How a run's tasks are ordered against others on their queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskScheduling {
    /// 0 (most urgent) to 9.
    pub priority: u8,
    /// The fairness class, normalised (trimmed, lowercased); `None`: the shared default class.
    pub fairness_key: Option<String>,
    /// The class's share of dispatch against other classes of the same priority, 1 to 1000.
    pub fairness_weight: u16,
}

impl Default for TaskScheduling {
    fn default() -> Self {
        Self {
            priority: PRIORITY_DEFAULT,
            fairness_key: None,
            fairness_weight: FAIRNESS_WEIGHT_DEFAULT,
        }
    }
}

impl TaskScheduling {
    /// The fairness class the run's tasks count in.
    pub fn class(&self) -> &str {
        class_of(self.fairness_key.as_deref())
    }

    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The fairness class of a fairness key: the key, or the shared default class without one.
pub fn class_of(fairness_key: Option<&str>) -> &str {
    fairness_key.unwrap_or(DEFAULT_CLASS)
}

/// A requested priority, or the contract's message when it is out of range.
pub fn priority(requested: i64) -> Result<u8, &'static str> {
    u8::try_from(requested)
        .ok()
        .filter(|p| (PRIORITY_MIN..=PRIORITY_MAX).contains(p))
        .ok_or(PRIORITY_RANGE_MESSAGE)
}

/// A requested fairness weight, or the contract's message when it is out of range.
pub fn fairness_weight(requested: i64) -> Result<u16, &'static str> {
    u16::try_from(requested)
        .ok()
        .filter(|w| (FAIRNESS_WEIGHT_MIN..=FAIRNESS_WEIGHT_MAX).contains(w))
        .ok_or(FAIRNESS_WEIGHT_MESSAGE)
}

/// A requested fairness key as the run keeps it: trimmed, then lowercased; blank is no key.
/// 1 to 64 of letters, digits, `.`, `_`, `:` and `-`, checked before lowercasing.
pub fn fairness_key(requested: &str) -> Result<Option<String>, &'static str> {
    let trimmed = requested.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if trimmed.len() > FAIRNESS_KEY_MAX || !trimmed.chars().all(allowed) {
        return Err(FAIRNESS_KEY_MESSAGE);
    }
    Ok(Some(trimmed.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_takes_zero_to_nine() {
        assert_eq!(priority(0), Ok(0));
        assert_eq!(priority(9), Ok(9));
        assert_eq!(priority(10), Err(PRIORITY_RANGE_MESSAGE));
        assert_eq!(priority(-1), Err(PRIORITY_RANGE_MESSAGE));
        assert_eq!(priority(i64::MAX), Err(PRIORITY_RANGE_MESSAGE));
    }

    #[test]
    fn weight_takes_one_to_a_thousand() {
        assert_eq!(fairness_weight(1), Ok(1));
        assert_eq!(fairness_weight(1000), Ok(1000));
        assert!(fairness_weight(0).is_err());
        assert!(fairness_weight(1001).is_err());
        assert!(fairness_weight(70_000).is_err());
    }

    #[test]
    fn keys_are_trimmed_lowercased_and_checked() {
        assert_eq!(fairness_key("  Tenant-A:eu.1_x "), Ok(Some("tenant-a:eu.1_x".into())));
        assert_eq!(fairness_key("   "), Ok(None));
        assert_eq!(fairness_key("tenant a"), Err(FAIRNESS_KEY_MESSAGE));
        assert_eq!(fairness_key("tenant/a"), Err(FAIRNESS_KEY_MESSAGE));
        assert_eq!(fairness_key("é"), Err(FAIRNESS_KEY_MESSAGE));
        assert_eq!(fairness_key(&"k".repeat(64)), Ok(Some("k".repeat(64))));
        assert_eq!(fairness_key(&"k".repeat(65)), Err(FAIRNESS_KEY_MESSAGE));
    }

    #[test]
    fn no_key_is_the_default_class() {
        assert_eq!(TaskScheduling::default().class(), DEFAULT_CLASS);
        let keyed = TaskScheduling {
            fairness_key: Some("a".into()),
            ..TaskScheduling::default()
        };
        assert_eq!(keyed.class(), "a");
        assert!(!keyed.is_default());
    }
}
