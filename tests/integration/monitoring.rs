//! deploy/monitoring/ is generated from the rules file and the dashboard: the
//! PrometheusRule carries exactly the rules' groups, the ConfigMap exactly the dashboard.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn prometheus_rule_holds_exactly_the_rules_file() {
    let rules: Value = serde_saphyr::from_str(&read("alerts/gpujob-operator.rules.yaml")).unwrap();
    let crd: Value =
        serde_saphyr::from_str(&read("deploy/monitoring/prometheusrule.yaml")).unwrap();
    assert_eq!(crd["kind"], "PrometheusRule");
    assert_eq!(
        crd["spec"]["groups"], rules["groups"],
        "deploy/monitoring/prometheusrule.yaml is stale: run deploy/monitoring/generate.py"
    );
}

#[test]
fn dashboard_config_map_holds_exactly_the_dashboard() {
    let dashboard = read("dashboards/gpujob-operator.json");
    let cm: Value =
        serde_saphyr::from_str(&read("deploy/monitoring/dashboard-configmap.yaml")).unwrap();
    assert_eq!(
        cm["metadata"]["labels"]["grafana_dashboard"], "1",
        "labelled for Grafana's sidecar"
    );
    assert_eq!(
        cm["data"]["gpujob-operator.json"].as_str().unwrap(),
        dashboard,
        "deploy/monitoring/dashboard-configmap.yaml is stale: run deploy/monitoring/generate.py"
    );
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
}
