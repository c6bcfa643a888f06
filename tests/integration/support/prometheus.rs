//! A real Prometheus (Debian's package) scraping operator replicas, queried over its
//! HTTP API. Stopped (killed) on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use devcluster::wait;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub struct Prometheus {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

fn free_port() -> u16 {
    devcluster::ports::free().unwrap()
}

/// A loopback address with a free port, for a replica's --listen-address (from below the
/// ephemeral range: see devcluster::ports).
pub fn free_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

impl Prometheus {
    /// Scrapes `targets` every second as job `gpujob-operator` (namespace label
    /// `gpujob-system`, as Kubernetes service discovery would add) and evaluates
    /// `rules` every second.
    pub async fn start(targets: &[String], rules: &str) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("gpujob-prometheus-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{rules}\"]\n\
             scrape_configs:\n  - job_name: gpujob-operator\n    static_configs:\n      - targets: [{}]\n        labels:\n          namespace: gpujob-system\n",
            targets.join(", ")
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package `prometheus`) must be installed");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let url = p.url.clone();
        wait::until(
            "Prometheus to be ready",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                let url = url.clone();
                async move {
                    get(&format!("{url}/-/ready"))
                        .await
                        .ok()
                        .filter(|(code, _)| *code == 200)
                }
            },
        )
        .await
        .unwrap();
        p
    }

    /// An instant query; the API's JSON answer (status, data or error).
    pub async fn query(&self, expr: &str) -> serde_json::Value {
        let q: String = form_urlencode(expr);
        let (_, body) = get(&format!("{}/api/v1/query?query={q}", self.url))
            .await
            .unwrap();
        serde_json::from_str(&body).unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn form_urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The body of a plain HTTP GET that answered 200 (a replica's `/metrics`, say).
pub async fn get_text(url: &str) -> Result<String, String> {
    match get(url).await? {
        (200, body) => Ok(body),
        (code, body) => Err(format!("{url} answered {code}: {body}")),
    }
}

async fn get(url: &str) -> Result<(u16, String), String> {
    let client: Client<_, Empty<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let res = client.get(uri).await.map_err(|e| format!("{e}"))?;
    let code = res.status().as_u16();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{e}"))?
        .to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}
