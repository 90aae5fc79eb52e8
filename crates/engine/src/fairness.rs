//! Sharing dispatch: the order in which a poller is offered a queue's ready tasks. Urgency wins
//! (lower priority numbers first); inside one priority, fairness classes take turns by weight:
//! the next task comes from the class with the least recent dispatch per unit of weight, and
//! each class stays first-in, first-out. Recent dispatch is a score that halves every
//! [`HALF_LIFE_MS`], so a class idle for a while starts again from about nothing.
//!
//! This is DW's deficit round robin by recent dispatch score over weight, with one correction:
//! DW adds a task's weight to its class's score and then divides by it, so weights cancel out
//! between polls and two keys weighted 3:1 share 50/50. Here a dispatch adds 1, so a standing
//! backlog is shared in the ratio of the weights.

use crate::Millis;
use std::collections::{BTreeMap, VecDeque};

pub const HALF_LIFE_MS: i64 = 30_000;
/// A class whose score fell below this is forgotten (it would count as nothing anyway).
const FADED: f64 = 1e-3;

/// What one ready task brings to the order.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub priority: u8,
    pub class: &'a str,
    pub weight: u16,
}

/// One queue's recent dispatch per fairness class.
#[derive(Clone, Debug, Default)]
pub struct RecentDispatch {
    classes: BTreeMap<String, Score>,
}

#[derive(Clone, Copy, Debug)]
struct Score {
    value: f64,
    at: Millis,
}

impl Score {
    fn at(self, now: Millis) -> f64 {
        let elapsed = (now - self.at).max(0) as f64;
        self.value * 0.5f64.powf(elapsed / HALF_LIFE_MS as f64)
    }
}

impl RecentDispatch {
    /// The class's score at `now`, decayed; 0 for a class never or not lately dispatched.
    pub fn score(&self, class: &str, now: Millis) -> f64 {
        self.classes.get(class).map_or(0.0, |s| s.at(now))
    }

    /// One task of `class` was dispatched at `now`.
    pub fn record(&mut self, class: &str, now: Millis) {
        let value = self.score(class, now) + 1.0;
        self.classes.insert(class.to_string(), Score { value, at: now });
        self.classes.retain(|_, s| s.at(now) >= FADED);
    }

    /// Every class still remembered, with its score at `now`, by class.
    pub fn scores(&self, now: Millis) -> Vec<(String, f64)> {
        self.classes.iter().map(|(class, s)| (class.clone(), s.at(now))).collect()
    }
}

/// The order to offer `candidates` in, as indices into it: ascending priority, and inside a
/// priority the class with the lowest (recent score + picks so far) / weight of its oldest task
/// first, ties to the class met first. `candidates` come oldest first within a class.
pub fn dispatch_order(candidates: &[Candidate<'_>], recent: &RecentDispatch, now: Millis) -> Vec<usize> {
    let mut tiers: BTreeMap<u8, Vec<usize>> = BTreeMap::new();
    for (index, candidate) in candidates.iter().enumerate() {
        tiers.entry(candidate.priority).or_default().push(index);
    }
    let mut order = Vec::with_capacity(candidates.len());
    for tier in tiers.into_values() {
        share_tier(candidates, &tier, recent, now, &mut order);
    }
    order
}

/// Appends one priority tier's candidates in fair order.
fn share_tier(candidates: &[Candidate<'_>], tier: &[usize], recent: &RecentDispatch, now: Millis, order: &mut Vec<usize>) {
    // Classes in the order their oldest task appears; each its queue of tasks.
    let mut classes: Vec<(&str, f64, VecDeque<usize>)> = Vec::new();
    for &index in tier {
        let class = candidates[index].class;
        match classes.iter_mut().find(|(name, _, _)| *name == class) {
            Some((_, _, queue)) => queue.push_back(index),
            None => classes.push((class, recent.score(class, now), VecDeque::from([index]))),
        }
    }
    if classes.len() == 1 {
        order.extend(tier);
        return;
    }
    loop {
        let mut best: Option<(usize, f64)> = None;
        for (position, (_, score, queue)) in classes.iter().enumerate() {
            let Some(&head) = queue.front() else { continue };
            let share = score / f64::from(candidates[head].weight.max(1));
            if best.is_none_or(|(_, lowest)| share < lowest) {
                best = Some((position, share));
            }
        }
        let Some((position, _)) = best else { break };
        let (_, score, queue) = &mut classes[position];
        order.extend(queue.pop_front());
        *score += 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(priority: u8, class: &str, weight: u16) -> Candidate<'_> {
        Candidate { priority, class, weight }
    }

    fn classes_in_order<'a>(candidates: &[Candidate<'a>], recent: &RecentDispatch) -> Vec<&'a str> {
        dispatch_order(candidates, recent, 0)
            .into_iter()
            .map(|i| candidates[i].class)
            .collect()
    }

    #[test]
    fn urgency_wins_over_arrival() {
        let candidates = [candidate(9, "a", 1), candidate(0, "b", 1), candidate(5, "c", 1)];
        assert_eq!(dispatch_order(&candidates, &RecentDispatch::default(), 0), vec![1, 2, 0]);
    }

    #[test]
    fn one_class_keeps_arrival_order() {
        let candidates = [candidate(5, "a", 1), candidate(5, "a", 1), candidate(5, "a", 1)];
        assert_eq!(dispatch_order(&candidates, &RecentDispatch::default(), 0), vec![0, 1, 2]);
    }

    #[test]
    fn classes_alternate_at_equal_weight_and_heavier_ones_get_more() {
        let even: Vec<_> = (0..4)
            .map(|_| candidate(5, "alpha", 1))
            .chain((0..4).map(|_| candidate(5, "beta", 1)))
            .collect();
        assert_eq!(
            classes_in_order(&even, &RecentDispatch::default()),
            ["alpha", "beta", "alpha", "beta", "alpha", "beta", "alpha", "beta"]
        );
        let weighted: Vec<_> = (0..4)
            .map(|_| candidate(5, "w", 3))
            .chain((0..4).map(|_| candidate(5, "p", 1)))
            .collect();
        assert_eq!(
            classes_in_order(&weighted, &RecentDispatch::default()),
            ["w", "p", "w", "w", "w", "p", "p", "p"]
        );
    }

    #[test]
    fn recent_dispatch_puts_a_busy_class_behind() {
        let mut recent = RecentDispatch::default();
        for _ in 0..3 {
            recent.record("busy", 0);
        }
        let candidates = [candidate(5, "busy", 1), candidate(5, "quiet", 1)];
        assert_eq!(classes_in_order(&candidates, &recent), ["quiet", "busy"]);
    }

    #[test]
    fn scores_halve_every_half_life_and_fade_away() {
        let mut recent = RecentDispatch::default();
        recent.record("a", 0);
        recent.record("a", 0);
        assert!((recent.score("a", HALF_LIFE_MS) - 1.0).abs() < 1e-9);
        recent.record("b", HALF_LIFE_MS * 20);
        assert_eq!(recent.scores(HALF_LIFE_MS * 20).len(), 1, "a faded and was forgotten");
    }

    /// A standing backlog of two classes weighted 3:1, one task dispatched per poll: the
    /// weights hold between polls, not only inside one batch.
    #[test]
    fn a_standing_backlog_is_shared_by_weight_across_polls() {
        let mut recent = RecentDispatch::default();
        let mut dispatched = BTreeMap::<&str, u32>::new();
        for poll in 0..4000i64 {
            let now = poll * 15;
            let candidates = [candidate(5, "heavy", 3), candidate(5, "light", 1)];
            let first = candidates[dispatch_order(&candidates, &recent, now)[0]].class;
            recent.record(first, now);
            *dispatched.entry(first).or_default() += 1;
        }
        let heavy = f64::from(dispatched["heavy"]) / 4000.0;
        assert!((heavy - 0.75).abs() < 0.01, "heavy got {heavy}");
    }

    #[test]
    fn tasks_without_a_key_share_one_class() {
        let candidates = [
            candidate(5, crate::scheduling::DEFAULT_CLASS, 1),
            candidate(5, crate::scheduling::DEFAULT_CLASS, 1),
            candidate(5, "tenant", 1),
        ];
        assert_eq!(dispatch_order(&candidates, &RecentDispatch::default(), 0), vec![0, 2, 1]);
    }
}
