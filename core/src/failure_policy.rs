//! Pure: a GpuJob's failure rules as its Jobs' pod failure policy, and which rule a
//! failed Job's condition says matched (docs/api.md, "Failure rules").

use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};

use crate::api::{
    CONTAINER_NAME, ConditionStatus, ExitCodeOperator, FailureAction, FailureRule, GpuJobSpec,
    MAX_FAILURE_RULES,
};

/// The Job condition reason for a failure that matched a pod failure policy rule.
pub const REASON_POD_FAILURE_POLICY: &str = "PodFailurePolicy";

/// What the rule that a failed Job's pod matched says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedRule {
    /// The operator's own rule, after the GpuJob's: the pod was disrupted
    /// (`DisruptionTarget`: preemption, eviction, a node drain or taint, pod garbage
    /// collection). Not the run's fault: retried at once, not counted.
    Disruption,
    /// The GpuJob's failure rule `index`, and what it says.
    Rule { index: usize, action: FailureAction },
}

/// The disruption rule's name in [`crate::api::ANNOTATION_FAILURE_RULES`].
const DISRUPTION: &str = "Disruption";

fn rules(spec: &GpuJobSpec) -> &[FailureRule] {
    let rules = spec.v2.as_ref().map_or(&[][..], |v2| &v2.failure_rules[..]);
    &rules[..rules.len().min(MAX_FAILURE_RULES)]
}

/// The action as the API spells it.
pub fn action_name(action: FailureAction) -> &'static str {
    match action {
        FailureAction::FailGpuJob => "FailGpuJob",
        FailureAction::Retry => "Retry",
        FailureAction::RetryWithoutCounting => "RetryWithoutCounting",
    }
}

/// The Job's pod failure policy: the GpuJob's failure rules in order, then the
/// disruption rule. Every rule fails the Job (`FailJob`, not `Ignore` or `Count`): the
/// Job ends and its condition names the rule's index, and the plan does what the rule
/// says; a next attempt is a Job of its own, started once this one's pods are gone.
pub fn pod_failure_policy(spec: &GpuJobSpec) -> PodFailurePolicy {
    let rules = rules(spec);
    let fail_job = |on_exit_codes, on_pod_conditions| PodFailurePolicyRule {
        action: "FailJob".to_owned(),
        on_exit_codes,
        on_pod_conditions,
    };
    let mut out: Vec<PodFailurePolicyRule> = rules
        .iter()
        .map(|rule| {
            let codes = rule.on_exit_codes.as_ref().map(|c| {
                // The Job API wants them sorted and distinct.
                let mut values = c.values.clone();
                values.sort_unstable();
                values.dedup();
                PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(CONTAINER_NAME.to_owned()),
                    operator: match c.operator {
                        ExitCodeOperator::In => "In",
                        ExitCodeOperator::NotIn => "NotIn",
                    }
                    .to_owned(),
                    values,
                }
            });
            let conditions = rule.on_pod_conditions.as_ref().map(|patterns| {
                patterns
                    .iter()
                    .map(|p| PodFailurePolicyOnPodConditionsPattern {
                        type_: p.type_.clone(),
                        status: Some(
                            match p.status.unwrap_or(ConditionStatus::True) {
                                ConditionStatus::True => "True",
                                ConditionStatus::False => "False",
                                ConditionStatus::Unknown => "Unknown",
                            }
                            .to_owned(),
                        ),
                    })
                    .collect()
            });
            fail_job(codes, conditions)
        })
        .collect();
    out.push(fail_job(
        None,
        Some(vec![PodFailurePolicyOnPodConditionsPattern {
            type_: "DisruptionTarget".to_owned(),
            status: Some("True".to_owned()),
        }]),
    ));
    PodFailurePolicy { rules: out }
}

/// What each rule of the Job's pod failure policy does, in order, when the GpuJob has
/// rules of its own (without, the disruption rule is the only one and no annotation is
/// written): the Job says what its own rules meant even after the spec changed.
pub fn annotation(spec: &GpuJobSpec) -> Option<String> {
    let rules = rules(spec);
    (!rules.is_empty()).then(|| {
        rules
            .iter()
            .map(|r| action_name(r.action))
            .chain([DISRUPTION])
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// The rule a failed Job's condition says matched: reason `PodFailurePolicy`, and the
/// Job controller's message ending `... matching FailJob rule at index <i>` (its wording
/// since Kubernetes 1.26), read against the Job's [`crate::api::ANNOTATION_FAILURE_RULES`].
/// `None` for any other failure, or a message or annotation not understood.
pub fn matched_rule(reason: &str, message: &str, rules: Option<&str>) -> Option<MatchedRule> {
    if reason != REASON_POD_FAILURE_POLICY {
        return None;
    }
    let index: usize = message
        .rsplit_once("rule at index ")?
        .1
        .trim()
        .parse()
        .ok()?;
    let name = match rules {
        Some(rules) => rules.split(',').nth(index)?,
        None if index == 0 => DISRUPTION,
        None => return None,
    };
    let action = match name {
        DISRUPTION => return Some(MatchedRule::Disruption),
        "FailGpuJob" => FailureAction::FailGpuJob,
        "Retry" => FailureAction::Retry,
        "RetryWithoutCounting" => FailureAction::RetryWithoutCounting,
        _ => return None,
    };
    Some(MatchedRule::Rule { index, action })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::ANNOTATION_FAILURE_RULES;
    use crate::job::desired_job;
    use crate::job::tests::gpujob;
    use serde_json::json;

    #[test]
    fn a_gpujobs_failure_rules_come_first_and_the_job_says_what_they_mean() {
        let mut g = gpujob("train");
        let rules: Vec<FailureRule> = serde_json::from_value(json!([
            {"action": "FailGpuJob", "onExitCodes": {"operator": "In", "values": [42, 3, 42]}},
            {"action": "RetryWithoutCounting", "onPodConditions": [{"type": "ConfigIssue"}]},
        ]))
        .unwrap();
        g.spec.v2 = Some(crate::api::V2Only {
            failure_rules: rules,
            ..Default::default()
        });
        let job = desired_job(&g, 1);
        let policy = job.spec.unwrap().pod_failure_policy.unwrap();
        assert_eq!(policy.rules.len(), 3);
        assert!(policy.rules.iter().all(|r| r.action == "FailJob"));
        let codes = policy.rules[0].on_exit_codes.as_ref().unwrap();
        assert_eq!(
            (codes.container_name.as_deref(), codes.operator.as_str()),
            (Some(CONTAINER_NAME), "In")
        );
        assert_eq!(codes.values, vec![3, 42], "sorted and distinct");
        let pattern = &policy.rules[1].on_pod_conditions.as_ref().unwrap()[0];
        assert_eq!(
            (pattern.type_.as_str(), pattern.status.as_deref()),
            ("ConfigIssue", Some("True"))
        );
        let last = &policy.rules[2].on_pod_conditions.as_ref().unwrap()[0];
        assert_eq!(last.type_, "DisruptionTarget");
        let said = job.metadata.annotations.unwrap()[ANNOTATION_FAILURE_RULES].clone();
        assert_eq!(said, "FailGpuJob,RetryWithoutCounting,Disruption");

        let at = |i: usize| {
            format!(
                "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index {i}"
            )
        };
        assert_eq!(
            matched_rule("PodFailurePolicy", &at(0), Some(&said)),
            Some(MatchedRule::Rule {
                index: 0,
                action: FailureAction::FailGpuJob
            })
        );
        assert_eq!(
            matched_rule("PodFailurePolicy", &at(1), Some(&said)),
            Some(MatchedRule::Rule {
                index: 1,
                action: FailureAction::RetryWithoutCounting
            })
        );
        assert_eq!(
            matched_rule("PodFailurePolicy", &at(2), Some(&said)),
            Some(MatchedRule::Disruption)
        );
        assert_eq!(matched_rule("PodFailurePolicy", &at(3), Some(&said)), None);
    }

    #[test]
    fn a_failed_jobs_condition_names_the_rule_that_matched() {
        // The Job controller's wording (pkg/controller/job/pod_failure_policy.go).
        let disrupted =
            "Pod ns/train-1-abcde has condition DisruptionTarget matching FailJob rule at index 0";
        assert_eq!(
            matched_rule("PodFailurePolicy", disrupted, None),
            Some(MatchedRule::Disruption)
        );
        // Another reason, an index no rule has, or a message not understood: no rule.
        assert_eq!(matched_rule("BackoffLimitExceeded", disrupted, None), None);
        let beyond = "Pod ns/p has condition DisruptionTarget matching FailJob rule at index 7";
        assert_eq!(matched_rule("PodFailurePolicy", beyond, None), None);
        assert_eq!(
            matched_rule("PodFailurePolicy", "something else", None),
            None
        );
    }
}
