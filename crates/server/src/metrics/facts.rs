//! The store's committed facts and commit times, counted. The store calls these on its
//! committing thread after COMMIT, so they only add to counters.

use super::Metrics;
use capstan_store::{Commit, Fact, Observer};

impl Observer for Metrics {
    fn committed(&self, facts: &[Fact]) {
        for fact in facts {
            match fact {
                Fact::RunStarted { namespace, workflow_type } => {
                    let workflow_type = self.workflow_type_label(namespace, workflow_type);
                    self.workflows_started.with_label_values(&[namespace, workflow_type]).inc();
                }
                Fact::RunClosed {
                    namespace,
                    workflow_type,
                    reason,
                } => {
                    let workflow_type = self.workflow_type_label(namespace, workflow_type);
                    self.workflows_closed.with_label_values(&[namespace, workflow_type, reason]).inc();
                }
                Fact::LeaseExpired { namespace, kind } => {
                    self.namespace_seen(namespace);
                    self.lease_expiries.with_label_values(&[namespace, kind.as_str()]).inc();
                }
                Fact::ActivityTimedOut { namespace, timeout_kind } => {
                    self.namespace_seen(namespace);
                    self.activity_timeouts.with_label_values(&[namespace, timeout_kind]).inc();
                }
                Fact::TimerFired { namespace } => {
                    self.namespace_seen(namespace);
                    self.timers_fired.with_label_values(&[namespace]).inc();
                }
                Fact::HandedOff { namespace, kind } => {
                    self.namespace_seen(namespace);
                    self.hand_offs.with_label_values(&[namespace, kind.as_str()]).inc();
                }
                Fact::HistoryBudgetCrossed { namespace, pressure } => {
                    self.namespace_seen(namespace);
                    self.history_budget_crossings.with_label_values(&[namespace, pressure]).inc();
                }
            }
        }
    }

    fn commit(&self, commit: Commit) {
        self.commit_seconds.observe(commit.took.as_secs_f64());
        self.commit_transactions.observe(commit.transactions as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_engine::TaskKind;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .map(|value| value.parse().unwrap())
    }

    #[test]
    fn facts_are_counted_under_their_labels_and_types_past_the_cap_under_other() {
        let metrics = Metrics::new();
        let started = |workflow_type: &str| Fact::RunStarted {
            namespace: "default".into(),
            workflow_type: workflow_type.into(),
        };
        metrics.committed(&[started("orders"), started("orders")]);
        metrics.committed(&[Fact::LeaseExpired {
            namespace: "billing".into(),
            kind: TaskKind::Activity,
        }]);
        let text = metrics.families_text();
        assert_eq!(
            sample(
                &text,
                r#"capstan_workflows_started_total{namespace="default",workflow_type="orders"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"capstan_workflows_closed_total{namespace="default",reason="failed",workflow_type="orders"}"#
            ),
            Some(0.0),
            "a type's close series exist from its first start"
        );
        assert_eq!(
            sample(&text, r#"capstan_lease_expiries_total{kind="activity",namespace="billing"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"capstan_lease_expiries_total{kind="workflow",namespace="billing"}"#),
            Some(0.0)
        );
        metrics.committed(&[Fact::HistoryBudgetCrossed {
            namespace: "billing".into(),
            pressure: "continue_as_new_recommended",
        }]);
        let text = metrics.families_text();
        let crossings = |pressure: &str| {
            sample(
                &text,
                &format!(r#"capstan_history_budget_crossings_total{{namespace="billing",pressure="{pressure}"}}"#),
            )
        };
        assert_eq!(
            (crossings("continue_as_new_recommended"), crossings("approaching")),
            (Some(1.0), Some(0.0))
        );
        for n in 0..super::super::LABEL_VALUES_MAX {
            metrics.committed(&[started(&format!("type-{n}"))]);
        }
        let text = metrics.families_text();
        assert!(
            sample(
                &text,
                r#"capstan_workflows_started_total{namespace="default",workflow_type="_other"}"#
            )
            .unwrap()
                >= 1.0,
            "types past the cap are counted, under _other"
        );
        let types = text.lines().filter(|l| l.starts_with("capstan_workflows_started_total{")).count();
        assert_eq!(types, super::super::LABEL_VALUES_MAX + 1, "the cap holds");
    }
}
