//! `trainmem --version`: the package version and the commit the binary was built from.
use std::process::Command;

fn run(arg: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_trainmem")).arg(arg).output().expect("the binary runs");
    assert!(out.status.success(), "{arg}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn version_prints_the_package_version_and_the_commit() {
    let line = run("--version");
    assert_eq!(line, format!("trainmem {} (commit {})\n", env!("CARGO_PKG_VERSION"), trainmem::version::COMMIT));
    assert_eq!(run("-V"), line);
}

#[test]
fn the_commit_is_head_when_built_from_a_git_checkout() {
    // Without git or outside a checkout (a source tarball) there is nothing to compare with.
    let head = Command::new("git").args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"]).output();
    let Ok(head) = head else { return };
    if !head.status.success() || std::env::var("TRAINMEM_COMMIT").is_ok_and(|v| !v.is_empty()) {
        return;
    }
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(head.starts_with(trainmem::version::COMMIT), "HEAD {head}, stamped {}", trainmem::version::COMMIT);
    assert_eq!(trainmem::version::COMMIT.len(), 12);
}
