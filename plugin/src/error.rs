//! What can go wrong, each naming the object it happened to.

/// The plugin's errors: each says what failed on which object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the kubeconfig{}: {source}", .path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Kubeconfig {
        path: Option<String>,
        source: kube::config::KubeconfigError,
    },
    #[error("building a client for the cluster: {0}")]
    Client(#[source] kube::Error),
    #[error(
        "the API group gpujob.dev has no GpuJob resource on this cluster (is the CRD installed?): {0}"
    )]
    NoCrd(String),
    #[error("GpuJob {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("GpuJob {namespace}/{name} does not decode as a GpuJob: {source}")]
    Decode {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Input(String),
    /// A log stream the API server opened and then broke off (the pod went, the
    /// connection dropped): the lines before it were written.
    #[error("{what}: the stream broke off: {source}")]
    Stream {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the output: {0}")]
    Output(#[source] std::io::Error),
}

impl Error {
    /// An API call `what` (e.g. "listing the Jobs of GpuJob ns/name") that failed.
    pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }
}
