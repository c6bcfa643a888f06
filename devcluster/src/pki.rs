//! Keys and certificates for one control plane, made with the `openssl` command line
//! (present on every machine this runs on; no extra crates to build).
//!
//! ECDSA P-256 throughout: fast to generate, accepted by kube-apiserver for serving and
//! for service-account token signing, and by rustls.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// A CA and a serving certificate for 127.0.0.1/localhost signed by it (PEM files):
/// kube-apiserver's, and reusable by any test server that must speak TLS.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

impl Pki {
    /// Where [`Pki::ensure`] puts the files in `dir`; creates nothing (for reading the
    /// files of a control plane that is already running).
    pub fn at(dir: &Path) -> Pki {
        Pki {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        }
    }

    /// Writes a CA, a serving certificate for 127.0.0.1/localhost signed by it, and a
    /// service-account key pair into `dir`. Reuses them when all are already there (a
    /// restart of the same state folder keeps tokens and kubeconfigs valid).
    pub fn ensure(dir: &Path) -> Result<Pki, Error> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let pki = Pki::at(dir);
        let all = [
            &pki.ca_cert,
            &pki.serving_cert,
            &pki.serving_key,
            &pki.sa_key,
            &pki.sa_pub,
        ];
        if all.iter().all(|p| p.exists()) {
            return Ok(pki);
        }
        let ca_key = dir.join("ca.key");
        let csr = dir.join("apiserver.csr");
        let ext = dir.join("apiserver.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,\
             DNS:kubernetes.default.svc,IP:10.0.0.1\nextendedKeyUsage=serverAuth\n\
             basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n",
        )
        .map_err(Error::io(format!("writing {}", ext.display())))?;
        genkey(&ca_key)?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            s(&ca_key),
            "-out",
            s(&pki.ca_cert),
            "-days",
            "3650",
            "-subj",
            "/CN=devcluster-ca",
        ])?;
        genkey(&pki.serving_key)?;
        openssl(&[
            "req",
            "-new",
            "-key",
            s(&pki.serving_key),
            "-out",
            s(&csr),
            "-subj",
            "/CN=kube-apiserver",
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            s(&csr),
            "-CA",
            s(&pki.ca_cert),
            "-CAkey",
            s(&ca_key),
            "-CAcreateserial",
            "-out",
            s(&pki.serving_cert),
            "-days",
            "3650",
            "-extfile",
            s(&ext),
        ])?;
        genkey(&pki.sa_key)?;
        openssl(&[
            "pkey",
            "-in",
            s(&pki.sa_key),
            "-pubout",
            "-out",
            s(&pki.sa_pub),
        ])?;
        Ok(pki)
    }
}

fn s(p: &Path) -> &str {
    // Paths here are built by us from UTF-8 state folders.
    p.to_str().unwrap_or_default()
}

fn genkey(out: &Path) -> Result<(), Error> {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        s(out),
    ])
}

fn openssl(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io("running openssl (is it installed?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("openssl {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim(),
        ))
    }
}
