//! What each step of a run was used for, kept as runs of consecutive steps of one kind: a
//! workflow of 200 `echo` activities is one entry, so the run document does not grow with its
//! history (it is read and written on every transition).

use crate::command::StepKind;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// Steps `first .. first + count` were all of `kind`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StepRun {
    first: u32,
    count: u32,
    kind: StepKind,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepLog {
    /// Ordered by `first`, never overlapping.
    runs: Vec<StepRun>,
}

impl StepLog {
    /// The kind recorded at `step`, if any.
    pub fn get(&self, step: &u32) -> Option<&StepKind> {
        let step = *step;
        let at = self.runs.partition_point(|run| run.first + run.count <= step);
        self.runs.get(at).filter(|run| run.first <= step).map(|run| &run.kind)
    }

    /// Records `step` (steps are taken in order, so this nearly always extends the last run).
    pub fn insert(&mut self, step: u32, kind: StepKind) {
        if let Some(last) = self.runs.last_mut() {
            if last.first + last.count == step && last.kind == kind {
                last.count += 1;
                return;
            }
            if step < last.first + last.count {
                // Out of order (not something the engine does): rebuild from the expanded form.
                let mut all = self.expanded();
                all.insert(step, kind);
                *self = Self::from_map(all);
                return;
            }
        }
        self.runs.push(StepRun {
            first: step,
            count: 1,
            kind,
        });
    }

    fn expanded(&self) -> BTreeMap<u32, StepKind> {
        self.runs
            .iter()
            .flat_map(|run| (run.first..run.first + run.count).map(move |step| (step, run.kind.clone())))
            .collect()
    }

    fn from_map(map: BTreeMap<u32, StepKind>) -> Self {
        let mut log = Self::default();
        for (step, kind) in map {
            log.insert(step, kind);
        }
        log
    }
}

impl Serialize for StepLog {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.runs.serialize(serializer)
    }
}

/// Documents before version 2 kept a map of step → kind; both forms are read.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredSteps {
    Runs(Vec<StepRun>),
    /// Keys as JSON wrote them (strings): an untagged enum does not convert them to numbers.
    Map(BTreeMap<String, StepKind>),
}

impl<'de> Deserialize<'de> for StepLog {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match StoredSteps::deserialize(deserializer)? {
            StoredSteps::Runs(runs) => Self::from_runs(runs),
            StoredSteps::Map(map) => {
                let steps = map
                    .into_iter()
                    .map(|(step, kind)| step.parse::<u32>().map(|step| (step, kind)))
                    .collect::<Result<_, _>>()
                    .map_err(|_| serde::de::Error::custom("a step number that is not a number"))?;
                Self::from_map(steps)
            }
        })
    }
}

impl StepLog {
    fn from_runs(runs: Vec<StepRun>) -> Self {
        let ordered = runs.windows(2).all(|pair| pair[0].first + pair[0].count <= pair[1].first) && runs.iter().all(|run| run.count > 0);
        if ordered {
            return Self { runs };
        }
        let all = runs
            .into_iter()
            .flat_map(|run| (run.first..run.first.saturating_add(run.count)).map(move |step| (step, run.kind.clone())))
            .collect();
        Self::from_map(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(name: &str) -> StepKind {
        StepKind::Activity(name.into())
    }

    #[test]
    fn consecutive_steps_of_one_kind_are_one_run() {
        let mut log = StepLog::default();
        for step in 1..=200 {
            log.insert(step, activity("echo"));
        }
        log.insert(201, StepKind::Timer);
        log.insert(202, activity("echo"));
        assert_eq!(log.runs.len(), 3);
        assert_eq!(log.get(&1), Some(&activity("echo")));
        assert_eq!(log.get(&200), Some(&activity("echo")));
        assert_eq!(log.get(&201), Some(&StepKind::Timer));
        assert_eq!(log.get(&202), Some(&activity("echo")));
        assert_eq!(log.get(&0), None);
        assert_eq!(log.get(&203), None);
        let text = serde_json::to_string(&log).unwrap();
        assert!(text.len() < 200, "{text}");
        assert_eq!(serde_json::from_str::<StepLog>(&text).unwrap(), log);
    }

    #[test]
    fn gaps_and_the_old_map_form_read_back() {
        let mut log = StepLog::default();
        log.insert(1, activity("a"));
        log.insert(3, activity("a"));
        log.insert(2, StepKind::Timer);
        assert_eq!(log.expanded().len(), 3);
        assert_eq!(log.get(&2), Some(&StepKind::Timer));
        assert_eq!(log.get(&3), Some(&activity("a")));
        let old = r#"{"1": {"Activity": "a"}, "2": "Timer", "3": {"Activity": "a"}}"#;
        assert_eq!(serde_json::from_str::<StepLog>(old).unwrap(), log);
        let unordered = r#"[{"first": 3, "count": 1, "kind": {"Activity": "a"}}, {"first": 1, "count": 2, "kind": "Timer"}]"#;
        let read: StepLog = serde_json::from_str(unordered).unwrap();
        assert_eq!(read.get(&1), Some(&StepKind::Timer));
        assert_eq!(read.get(&3), Some(&activity("a")));
    }
}
