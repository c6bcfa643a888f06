//! Crash points for tests. Compiled in only with the `failpoints` feature (test builds):
//! `GPUJOB_FAILPOINT=<name>` aborts the process right there, so a test can stop the
//! operator exactly between two effects and count what a restart makes of it.

/// Aborts the process when the failpoint `name` is armed (only with `failpoints`).
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("GPUJOB_FAILPOINT").is_ok_and(|armed| armed == name) {
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
