//! `rlx devices`: every device type, live or with the reason it is absent, agreeing with the
//! runtime's `available_devices()` and with the error `--device` gives.

use std::process::Command;

#[test]
fn devices_lists_every_type_and_agrees_with_the_runtime() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["devices", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let v = v.as_array().unwrap();
    let names: Vec<&str> = v.iter().map(|d| d["device"].as_str().unwrap()).collect();
    assert_eq!(names, ["cpu", "wgpu", "cuda"]);
    let live: Vec<String> = v
        .iter()
        .filter(|d| d["live"].as_bool().unwrap())
        .map(|d| d["device"].as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = rlx_runtime::available_devices()
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(live, want);
    // An absent device's detail is the reason `--device` gives.
    for d in v.iter().filter(|d| !d["live"].as_bool().unwrap()) {
        let name = d["device"].as_str().unwrap();
        let why = d["detail"].as_str().unwrap();
        assert!(!why.is_empty());
        let r = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(["run", "-q", "--device", name])
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../examples/healthy_mlp"
            ))
            .output()
            .unwrap();
        assert!(!r.status.success());
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            err.contains(&format!(
                "device {name} is not available on this machine: {why}"
            )),
            "{err}"
        );
    }
    let text = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .arg("devices")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("cpu    live    cpu ("), "{text}");
    assert!(text.lines().next().unwrap().ends_with(" cores)"), "{text}");
}
