//! Which trainmem this is: the package version and the commit it was built from, shown by
//! `trainmem --version` and in the page footer, so a figure can be traced to the estimator that
//! produced it (CHANGELOG.md says what changed in the numbers between versions).
//!
//! The commit is stamped by `build.rs` (from `TRAINMEM_COMMIT`, git, or `GITHUB_SHA`;
//! `unknown` in a source tarball without any of them).

/// The package version from Cargo.toml, e.g. `0.2.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The abbreviated commit hash the build came from, or `unknown`.
pub const COMMIT: &str = env!("TRAINMEM_COMMIT");

/// `trainmem 0.2.0 (commit 1c8a338e0f2b)`: what `--version` prints and the footer shows.
pub const LABEL: &str = concat!("trainmem ", env!("CARGO_PKG_VERSION"), " (commit ", env!("TRAINMEM_COMMIT"), ")");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_names_the_version_and_the_commit() {
        assert!(LABEL.starts_with(&format!("trainmem {VERSION} (commit ")));
        assert!(LABEL.ends_with(&format!("{COMMIT})")));
        assert!(!COMMIT.is_empty());
    }

    #[test]
    fn the_version_is_semver() {
        let parts: Vec<&str> = VERSION.split('.').collect();
        assert_eq!(parts.len(), 3, "{VERSION}");
        assert!(parts.iter().all(|p| p.parse::<u32>().is_ok()), "{VERSION}");
    }
}
