//! Repository paths that are safe to join under a local root.

/// Why a repository path cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsafe repository path {path:?}: {reason}")]
pub struct UnsafePath {
    pub path: String,
    pub reason: &'static str,
}

/// Checks that `path` is a relative path of plain components: no empty, `.` or `..`
/// component, no leading `/`, no backslash, NUL or control character, at most 4096 bytes.
pub fn check_repo_path(path: &str) -> Result<(), UnsafePath> {
    let refuse = |reason| {
        Err(UnsafePath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() || path.len() > 4096 {
        return refuse("empty or longer than 4096 bytes");
    }
    if path.starts_with('/') {
        return refuse("absolute");
    }
    if path.chars().any(|c| c == '\\' || c.is_control()) {
        return refuse("contains a backslash or a control character");
    }
    for component in path.split('/') {
        match component {
            "" => return refuse("has an empty component"),
            "." | ".." => return refuse("has a '.' or '..' component"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_pass() {
        for good in [
            "index.json",
            "layer00/layer00-w1.mxfp4tile",
            ".gitattributes",
            "a/.b/c",
        ] {
            assert!(check_repo_path(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a/",
            "a\\b",
            "a\0b",
            "a\nb",
        ] {
            assert!(check_repo_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_path_may_be_4096_bytes_long_and_no_longer() {
        let longest = format!("a/{}", "b".repeat(4094));
        assert!(check_repo_path(&longest).is_ok());
        let err = check_repo_path(&format!("{longest}c")).unwrap_err();
        assert_eq!(err.reason, "empty or longer than 4096 bytes");
        assert_eq!(check_repo_path("").unwrap_err().reason, err.reason);
    }
}
