//! The committed results of `tools/check_onnx.py` (ONNX's checker, ONNX
//! Runtime and PyTorch on the files the tract suite exports): every case
//! of the tract suite is recorded, each within tolerance of Forma.

use serde_json::Value;

#[test]
fn onnx_runtime_and_pytorch_agree_with_forma_on_every_tract_case() {
    let doc: Value = serde_json::from_str(include_str!("fixtures/onnx_check.json")).unwrap();
    let tol = doc["tolerance"].as_f64().unwrap();
    assert!(tol <= 1e-5);
    // The cases are the names `tract.rs` passes to `check`.
    let src = include_str!("tract.rs");
    let mut names: Vec<&str> = src
        .split("check(\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .collect();
    names.sort_unstable();
    let cases = doc["cases"].as_object().unwrap();
    let recorded: Vec<&str> = cases.keys().map(String::as_str).collect();
    assert_eq!(recorded, names, "rerun tools/check_onnx.py");
    for (name, case) in cases {
        let runs = case["runs"].as_array().unwrap();
        assert!(runs.len() >= 2, "{name}: two sizes from one file");
        for run in runs {
            let ort = run["onnxruntime_vs_forma"].as_f64().unwrap();
            assert!(ort <= tol, "{name}: ONNX Runtime off by {ort}");
            if let Some(pt) = run.get("pytorch_vs_forma") {
                let pt = pt.as_f64().unwrap();
                assert!(pt <= tol, "{name}: PyTorch off by {pt}");
            }
        }
    }
}
