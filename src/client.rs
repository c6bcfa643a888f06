//! The operator's API client: identified in every request, so the API server's audit
//! log and metrics tell replicas apart.

use http::HeaderValue;

/// `gpujob-operator/<version> (<identity>)`
pub fn user_agent(identity: &str) -> String {
    format!("gpujob-operator/{} ({identity})", env!("CARGO_PKG_VERSION"))
}

/// Adds the User-Agent to a client config (kube's client sends none of its own).
pub fn identify(
    mut config: kube::Config,
    identity: &str,
) -> Result<kube::Config, http::header::InvalidHeaderValue> {
    let value = HeaderValue::from_str(&user_agent(identity))?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, value));
    Ok(config)
}

/// rustls needs exactly one process-wide crypto provider; install ring's once.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
