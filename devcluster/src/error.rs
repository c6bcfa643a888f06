use std::path::PathBuf;

/// Everything that can go wrong while starting, using or stopping a control plane.
/// Messages name the component and, where there is one, the log file to read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Assets(String),
    #[error("{component} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    ExitedEarly {
        component: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error(
        "this control plane is attached, not owned: {0} is only possible for the process that started it"
    )]
    NotOwned(&'static str),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    pub(crate) fn invalid(what: impl Into<String>, message: impl std::fmt::Display) -> Error {
        Error::Invalid {
            what: what.into(),
            message: message.to_string(),
        }
    }
}
