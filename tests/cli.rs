//! The binary's command line, as a user meets it.

use std::process::Command;

#[test]
fn version_and_help_answer() {
    let bin = env!("CARGO_BIN_EXE_gpujob-operator");
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("gpujob-operator {}", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(bin)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: gpujob-operator"));

    let out = Command::new(bin).output().expect("run without arguments");
    assert!(
        !out.status.success(),
        "no command is an error, not a silent success"
    );
}
