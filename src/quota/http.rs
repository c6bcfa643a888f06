//! The `http` backend: `PUT`/`DELETE {base}/v1/reservations/{uid}` (docs/quota-api.md),
//! over HTTP or HTTPS (system roots or a CA bundle), with a bearer token re-read from its
//! file on every call (so it can be rotated; read off the worker threads, so a slow
//! volume cannot stall them), the caller's fencing token, and a timeout per call that
//! never outlives the caller's lease deadline.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;
use serde_json::json;

use super::{Call, QuotaError, QuotaProvider, Reserve, ReserveRequest};
use crate::apierror::error_chain;

/// The header that carries the caller's fencing token (docs/quota-api.md).
pub const FENCING_TOKEN_HEADER: &str = "Gpujob-Fencing-Token";

#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// `http(s)://host[:port][/prefix]`
    pub base_url: String,
    pub token_file: Option<PathBuf>,
    /// PEM bundle of CAs to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
    pub user_agent: String,
}

#[derive(Clone)]
pub struct HttpProvider {
    settings: Arc<HttpSettings>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider")
            .field("base_url", &self.settings.base_url)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Granted {
    id: String,
    /// What the reservation holds, when the service says.
    #[serde(default)]
    gpus: Option<i32>,
}

#[derive(Deserialize, Default)]
struct Refusal {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// Whether `url`'s host is this machine (or this pod): a token sent there does not
/// cross a network.
fn is_loopback(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match uri.host() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

impl HttpProvider {
    pub fn new(settings: HttpSettings) -> Result<HttpProvider, QuotaError> {
        let base = settings.base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(QuotaError::Config(format!(
                "--quota-url {base:?} must start with http:// or https://"
            )));
        }
        if settings.token_file.is_some() && base.starts_with("http://") && !is_loopback(&base) {
            return Err(QuotaError::Config(format!(
                "--quota-token-file with --quota-url {base:?}: the bearer token would cross the network unencrypted; use an https:// URL (plain http:// carries a token only to a loopback address: localhost, 127.0.0.0/8, [::1])"
            )));
        }
        let tls = match &settings.ca_file {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                    QuotaError::Config(format!("reading --quota-ca-file {}: {e}", path.display()))
                })?;
                for cert in certs {
                    let cert = cert.map_err(|e| {
                        QuotaError::Config(format!("parsing {}: {e}", path.display()))
                    })?;
                    roots
                        .add(cert)
                        .map_err(|e| QuotaError::Config(format!("{}: {e}", path.display())))?;
                }
                rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth()
            }
            None => match rustls::ClientConfig::builder().with_native_roots() {
                Ok(builder) => builder.with_no_client_auth(),
                // No system roots at all: plain http:// still works, https:// fails per
                // call with a certificate error that names the URL.
                Err(_) => rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            },
        };
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(HttpProvider {
            settings: Arc::new(HttpSettings {
                base_url: base,
                ..settings
            }),
            client,
        })
    }

    fn url(&self, uid: &str) -> String {
        format!("{}/v1/reservations/{uid}", self.settings.base_url)
    }

    async fn call(
        &self,
        op: &'static str,
        method: Method,
        uid: &str,
        body: Option<serde_json::Value>,
        call: &Call,
    ) -> Result<(StatusCode, String), QuotaError> {
        let url = self.url(uid);
        // The whole call (token file, connection, answer) ends by the configured timeout
        // or the caller's lease deadline, whichever comes first: an answer after the
        // deadline could not be acted on anyway.
        let (limit, capped) = match call.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(tokio::time::Instant::now());
                (
                    left.min(self.settings.timeout),
                    left < self.settings.timeout,
                )
            }
            None => (self.settings.timeout, false),
        };
        let exchange = self.exchange(op, method, &url, body, call);
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| QuotaError::Timeout {
                op,
                url: url.clone(),
                after: limit,
                capped,
            })?
    }

    async fn exchange(
        &self,
        op: &'static str,
        method: Method,
        url: &str,
        body: Option<serde_json::Value>,
        call: &Call,
    ) -> Result<(StatusCode, String), QuotaError> {
        let mut req = Request::builder()
            .method(method)
            .uri(url)
            .header(header::USER_AGENT, &self.settings.user_agent)
            .header(header::ACCEPT, "application/json");
        if let Some(token) = &call.token {
            req = req.header(FENCING_TOKEN_HEADER, token);
        }
        if let Some(path) = &self.settings.token_file {
            let token = tokio::fs::read_to_string(path).await.map_err(|e| {
                QuotaError::Config(format!(
                    "reading --quota-token-file {}: {e}",
                    path.display()
                ))
            })?;
            req = req.header(header::AUTHORIZATION, format!("Bearer {}", token.trim()));
        }
        let body = match body {
            Some(json) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(json.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        // hyper's errors say only "client error (Connect)"; the cause (refused, a TLS
        // certificate the CA bundle does not vouch for, ...) is in the source chain.
        let transport = |e: &dyn std::error::Error| QuotaError::Transport {
            op,
            url: url.to_owned(),
            message: error_chain(e),
        };
        let req = req.body(body).map_err(|e| transport(&e))?;
        let res = self.client.request(req).await.map_err(|e| transport(&e))?;
        let code = res.status();
        let bytes = res.into_body().collect().await.map_err(|e| transport(&e))?;
        let text = String::from_utf8_lossy(&bytes.to_bytes()).into_owned();
        if code == StatusCode::PRECONDITION_FAILED {
            return Err(QuotaError::Fenced {
                op,
                url: url.to_owned(),
                token: call.token.clone().unwrap_or_default(),
                body: text,
            });
        }
        Ok((code, text))
    }
}

impl QuotaProvider for HttpProvider {
    async fn reserve(&self, req: &ReserveRequest, call: &Call) -> Result<Reserve, QuotaError> {
        let body = json!({"namespace": req.namespace, "name": req.name, "gpus": req.gpus});
        let (code, text) = self
            .call("reserve", Method::PUT, &req.uid, Some(body), call)
            .await?;
        match code {
            StatusCode::OK | StatusCode::CREATED => {
                let g: Granted = serde_json::from_str(&text).map_err(|e| QuotaError::Status {
                    op: "reserve",
                    url: self.url(&req.uid),
                    code: code.as_u16(),
                    body: format!("unreadable grant ({e}): {text}"),
                })?;
                if g.id.is_empty() {
                    return Err(QuotaError::Status {
                        op: "reserve",
                        url: self.url(&req.uid),
                        code: code.as_u16(),
                        body: format!("grant without a reservation id: {text}"),
                    });
                }
                Ok(Reserve::Granted {
                    id: g.id,
                    gpus: g.gpus,
                })
            }
            StatusCode::CONFLICT => {
                let r: Refusal = serde_json::from_str(&text).unwrap_or_default();
                Ok(Reserve::Refused {
                    reason: if r.reason.is_empty() {
                        "QuotaRefused".to_owned()
                    } else {
                        r.reason
                    },
                    message: if r.message.is_empty() {
                        text
                    } else {
                        r.message
                    },
                })
            }
            _ => Err(QuotaError::Status {
                op: "reserve",
                url: self.url(&req.uid),
                code: code.as_u16(),
                body: text,
            }),
        }
    }

    async fn release(&self, uid: &str, call: &Call) -> Result<(), QuotaError> {
        let (code, text) = self
            .call("release", Method::DELETE, uid, None, call)
            .await?;
        match code {
            StatusCode::OK | StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(QuotaError::Status {
                op: "release",
                url: self.url(uid),
                code: code.as_u16(),
                body: text,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str, token: bool) -> HttpSettings {
        HttpSettings {
            base_url: url.to_owned(),
            token_file: token.then(|| PathBuf::from("/var/run/secrets/quota/token")),
            ca_file: None,
            timeout: std::time::Duration::from_secs(10),
            user_agent: "test".to_owned(),
        }
    }

    #[test]
    fn a_token_is_refused_for_plain_http_beyond_loopback() {
        crate::client::install_crypto_provider();
        for url in [
            "http://quota.example.com",
            "http://quota.quota-system.svc:8080/api",
            "http://10.0.0.7:8080",
            "http://127.0.0.1.example.com",
        ] {
            let e = HttpProvider::new(settings(url, true))
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(
                    |e| e.contains("use an https:// URL") && e.contains("--quota-token-file")
                ),
                "{url}: {e:?}"
            );
            // Without a token, plain http is the operator's choice.
            assert!(HttpProvider::new(settings(url, false)).is_ok(), "{url}");
        }
        for url in [
            "https://quota.example.com",
            "http://127.0.0.1:8080",
            "http://localhost:9000/x",
            "http://[::1]:8080",
        ] {
            assert!(HttpProvider::new(settings(url, true)).is_ok(), "{url}");
        }
    }
}
