//! Build script: stamps the commit the build came from into `TRAINMEM_COMMIT`, for
//! `trainmem --version` and the page footer (see `src/version.rs`).
//!
//! Where the commit comes from, first that answers:
//! 1. `TRAINMEM_COMMIT` in the environment (a packager building from a source tarball sets it);
//! 2. `git rev-parse HEAD` in the source tree (a clone, a worktree, a CI checkout);
//! 3. `GITHUB_SHA` (a CI checkout without `.git`);
//! 4. `unknown` (a source tarball without any of these): the build still works.
//!
//! The commit is abbreviated to [`COMMIT_CHARS`] hex digits, enough to be unique in any
//! repository of this size and what `git log --oneline` shows.

use std::path::Path;
use std::process::Command;

/// Hex digits of the commit hash kept in the label.
const COMMIT_CHARS: usize = 12;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TRAINMEM_COMMIT");
    println!("cargo:rerun-if-env-changed=GITHUB_SHA");
    let commit = from_env("TRAINMEM_COMMIT").or_else(from_git).or_else(|| from_env("GITHUB_SHA")).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TRAINMEM_COMMIT={commit}");
}

/// A non-empty variable, abbreviated if it is a full hash.
fn from_env(name: &str) -> Option<String> {
    let v = std::env::var(name).ok()?.trim().to_string();
    (!v.is_empty()).then(|| abbreviate(&v))
}

fn abbreviate(hash: &str) -> String {
    if hash.len() > COMMIT_CHARS && hash.chars().all(|c| c.is_ascii_hexdigit()) {
        hash[..COMMIT_CHARS].to_string()
    } else {
        hash.to_string()
    }
}

/// HEAD's commit, and the files to watch so that a new commit re-stamps the build.
fn from_git() -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(&dir).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // Only inside this package's own repository (not a parent directory's).
    let top = git(&["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != Path::new(&dir).canonicalize().ok()? {
        return None;
    }
    let hash = git(&["rev-parse", "HEAD"])?;
    // HEAD moves on checkout; the branch's ref on commit (loose or packed). Watch only files
    // that exist: a missing one would make cargo re-run this script on every build.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])?, git(&["rev-parse", "--git-path", "packed-refs"])?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &branch])?);
    }
    for p in watch {
        let p = if Path::new(&p).is_absolute() { p } else { format!("{dir}/{p}") };
        if Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    Some(abbreviate(&hash))
}
