//! deploy/crd/crd.yaml is exactly what `gpujob-operator crd` prints.

#[test]
fn deploy_crd_matches_the_generated_crd() {
    let generated = gpujob_operator::api::crd_yaml().expect("generate CRD");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/crd.yaml");
    let shipped = std::fs::read_to_string(path).expect("read deploy/crd/crd.yaml");
    assert!(
        generated == shipped,
        "deploy/crd/crd.yaml is out of date; regenerate it with `cargo run -- crd > deploy/crd/crd.yaml`"
    );
}

#[test]
fn the_binary_prints_the_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpujob-operator"))
        .arg("crd")
        .output()
        .expect("run gpujob-operator crd");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        text,
        gpujob_operator::api::crd_yaml().expect("generate CRD")
    );
    assert!(text.contains("name: gpujobs.gpujob.dev"));
}
