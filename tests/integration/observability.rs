//! The dashboard and the alert rules against a real Prometheus scraping three real
//! replicas through a scenario (successes, failures with retries, a leader kill): every
//! expression must parse and run, and every dashboard panel must return data.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

use std::time::Duration;

use gpujob_operator::api::Phase;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::prometheus::{Prometheus, free_address};
use support::replicas::{self, wait_holder};
use support::{TestEnv, phase, sim_env};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/dashboards/gpujob-operator.json"
);
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/alerts/gpujob-operator.rules.yaml"
);

/// Grafana's variables as a user with this job selected would have them (every
/// cluster: the test's Prometheus adds no cluster label).
fn substitute(expr: &str) -> String {
    expr.replace("${cluster}", ".*")
        .replace("$cluster", ".*")
        .replace("${job}", "gpujob-operator")
        .replace("$job", "gpujob-operator")
        .replace("${namespace}", "gpujob-system")
        .replace("$namespace", "gpujob-system")
        .replace("${__rate_interval}", "1m")
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m")
}

fn has_data(answer: &Value) -> bool {
    answer["status"] == "success"
        && answer["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
}

#[tokio::test]
async fn every_dashboard_panel_and_rule_works_against_real_prometheus() {
    let env = TestEnv::new("obs").await;
    let addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
    let mut rs: Vec<_> = (1..=3u8)
        .map(|n| {
            let addr = addresses[usize::from(n) - 1].clone();
            replicas::start(&env.cluster, &env.ns, n, &["--listen-address", &addr])
        })
        .collect();
    let prometheus = Prometheus::start(&addresses, RULES).await;
    let (leader, _) = wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |_| true).await;

    // The scenario: successes, failures with retries, one that exhausts its retries.
    for i in 0..6 {
        env.create(
            &format!("ok-{i}"),
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_DURATION_SECONDS", "1")])}),
        )
        .await;
    }
    for i in 0..3 {
        env.create(
            &format!("retry-{i}"),
            json!({"image": "i", "gpus": 1, "env": sim_env(&[("SIM_FAIL_ATTEMPTS", "1")])}),
        )
        .await;
    }
    env.create("broken", json!({"image": "i", "gpus": 1, "maxRetries": 1, "env": sim_env(&[("SIM_EXIT_CODE", "3")])}))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // … and a leader kill in the middle of it.
    let i = rs.iter().position(|r| r.identity() == leader).unwrap();
    rs[i].signal(Signal::SIGKILL);
    rs[i].wait_exit(Duration::from_secs(5)).await;
    wait_holder(&env.admin, &env.ns, Duration::from_secs(30), |h| {
        h != leader
    })
    .await;
    env.wait_gpujobs("the scenario to finish", Duration::from_secs(120), |all| {
        all.iter().all(|g| phase(g).is_some_and(Phase::is_final))
    })
    .await
    .unwrap();
    // Enough scrapes after the scenario for every rate() window.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Sanity: Prometheus sees the live replicas, and exactly one leads.
    let up = prometheus.query("sum(up{job=\"gpujob-operator\"})").await;
    assert_eq!(
        up["data"]["result"][0]["value"][1],
        "2",
        "{up}\n{}",
        prometheus.log()
    );
    let leaders = prometheus
        .query("sum(leader_election_master_status{job=\"gpujob-operator\"})")
        .await;
    assert_eq!(leaders["data"]["result"][0]["value"][1], "1", "{leaders}");

    // Every panel's data comes within a few scrapes of the scenario: asked again, a
    // second apart, until all have it or a minute has passed (a query that fails fails
    // every time).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (problems, alerts) = loop {
        let (problems, alerts) = dashboard_and_rules(&prometheus).await;
        if problems.is_empty() || tokio::time::Instant::now() >= deadline {
            break (problems, alerts);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(alerts >= 10, "at least ten alerts");
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Healthy scenario: nothing that pages is firing (the rules were evaluated all along).
    let firing = prometheus
        .query("ALERTS{alertstate=\"firing\",severity=\"critical\"}")
        .await;
    assert!(!has_data(&firing), "critical alerts firing: {firing}");
}

/// Each dashboard panel's queries and each rule's expression, asked of `prometheus`: what
/// failed or returned no data, and how many alerts the rules have.
async fn dashboard_and_rules(prometheus: &Prometheus) -> (Vec<String>, usize) {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut problems = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        let Some(targets) = panel["targets"].as_array() else {
            continue; // rows and text panels
        };
        let mut any_data = false;
        for target in targets {
            let expr = substitute(target["expr"].as_str().unwrap());
            let answer = prometheus.query(&expr).await;
            if answer["status"] != "success" {
                problems.push(format!("panel {title:?}: {expr}: {}", answer["error"]));
            }
            any_data |= has_data(&answer);
        }
        if !any_data {
            problems.push(format!("panel {title:?} returns no data"));
        }
    }
    let rules: Value = serde_saphyr::from_str(&std::fs::read_to_string(RULES).unwrap()).unwrap();
    let mut alerts = 0;
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            let answer = prometheus.query(expr).await;
            if answer["status"] != "success" {
                problems.push(format!("rule {}: {}", rule["alert"], answer["error"]));
            }
            alerts += usize::from(rule.get("alert").is_some());
        }
    }
    (problems, alerts)
}
