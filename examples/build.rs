//! Records the compiler's version for the training example's banner
//! (`FORMA_EXAMPLES_RUSTC`), as `rustc --version` prints it.

use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "rustc (version unknown)".to_string());
    println!("cargo:rustc-env=FORMA_EXAMPLES_RUSTC={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
