//! The statement a publisher signs: the artifact's identity and the SHA-256 of every file that
//! is not payload, in one canonical text. Specified in `docs/formats/signed-statement.md`.
//!
//! Layout is kept apart from validation: [`Statement::to_bytes`] writes the only bytes a
//! statement may have, and [`Statement::parse`] accepts exactly the bytes `to_bytes` would
//! write for what it read.

use std::collections::BTreeMap;

use minirun_format::identity::{is_canonical_repo_id, is_pinned_revision};
use minirun_format::tree::{FileDigest, check_repo_path};

/// The statement's file name at the artifact root; its signature is this name plus `.sig`.
pub const STATEMENT_FILE: &str = "minirun-statement.txt";
/// The detached signature beside the statement, as `ssh-keygen -Y sign` names it.
pub const SIGNATURE_FILE: &str = "minirun-statement.txt.sig";
/// The first line of every statement of this version.
pub const MAGIC: &str = "minirun-statement/1";
/// The most bytes a statement may have (about 100 bytes per listed file).
pub const MAX_STATEMENT_BYTES: u64 = 16 << 20;
/// The most files a statement may list.
pub const MAX_FILES: usize = 100_000;

/// One listed file's size and content digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub size: u64,
    pub sha256: [u8; 32],
}

/// Where the artifact came from, when its index names one upstream at a pinned revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub repo: String,
    pub revision: String,
}

/// What a publisher signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub identity: Option<Identity>,
    /// Every non-payload file by path (`/`-separated), sorted by the path's bytes.
    pub files: BTreeMap<String, Listed>,
}

/// Why bytes are not a statement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatementError {
    #[error("the statement is {0} bytes, more than the {MAX_STATEMENT_BYTES} a statement may have")]
    TooLarge(u64),
    #[error("the statement is not UTF-8 text")]
    NotText,
    #[error(
        "the statement does not begin with the line {MAGIC:?}: not a minirun statement of a version this build reads"
    )]
    NotAStatement,
    #[error("statement line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("the statement lists more than {MAX_FILES} files")]
    TooManyFiles,
    #[error(
        "the statement is not in its canonical form ({0}); a signer writes only the canonical bytes"
    )]
    NotCanonical(&'static str),
}

impl Statement {
    /// The canonical bytes: the magic line, `repo` and `revision` lines (`-` when unknown),
    /// then one `<sha256 hex> <size> <path>` line per file in path order; every line ends in LF.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (repo, revision) = match &self.identity {
            Some(id) => (id.repo.as_str(), id.revision.as_str()),
            None => ("-", "-"),
        };
        let mut text = format!("{MAGIC}\nrepo {repo}\nrevision {revision}\n");
        for (path, listed) in &self.files {
            let hex = FileDigest::Sha256(listed.sha256).hex();
            text.push_str(&format!("{hex} {} {path}\n", listed.size));
        }
        text.into_bytes()
    }

    /// Reads a statement, refusing anything but canonical bytes.
    pub fn parse(bytes: &[u8]) -> Result<Statement, StatementError> {
        if bytes.len() as u64 > MAX_STATEMENT_BYTES {
            return Err(StatementError::TooLarge(bytes.len() as u64));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| StatementError::NotText)?;
        let body = text.strip_suffix('\n').ok_or(StatementError::NotCanonical(
            "it does not end with a line feed",
        ))?;
        let mut lines = body.split('\n');
        if lines.next() != Some(MAGIC) {
            return Err(StatementError::NotAStatement);
        }
        let repo = field(lines.next(), 2, "repo")?;
        let revision = field(lines.next(), 3, "revision")?;
        let identity = identity(repo, revision)?;
        let mut files: BTreeMap<String, Listed> = BTreeMap::new();
        for (i, line) in lines.enumerate() {
            if files.len() == MAX_FILES {
                return Err(StatementError::TooManyFiles);
            }
            let (path, listed) = file_line(line).map_err(|reason| StatementError::BadLine {
                line: i + 4,
                reason,
            })?;
            if let Some((last, _)) = files.last_key_value()
                && path.as_bytes() <= last.as_bytes()
            {
                return Err(StatementError::NotCanonical(
                    "its files are not in strictly increasing path order",
                ));
            }
            files.insert(path, listed);
        }
        let statement = Statement { identity, files };
        match statement.to_bytes() == bytes {
            true => Ok(statement),
            false => Err(StatementError::NotCanonical(
                "a field is written other than the one way it may be",
            )),
        }
    }
}

fn field<'l>(line: Option<&'l str>, number: usize, key: &str) -> Result<&'l str, StatementError> {
    line.and_then(|l| l.strip_prefix(key))
        .and_then(|l| l.strip_prefix(' '))
        .ok_or_else(|| StatementError::BadLine {
            line: number,
            reason: format!("expected `{key} VALUE`"),
        })
}

fn identity(repo: &str, revision: &str) -> Result<Option<Identity>, StatementError> {
    match (repo, revision) {
        ("-", "-") => Ok(None),
        (repo, revision) if is_canonical_repo_id(repo) && is_pinned_revision(revision) => {
            Ok(Some(Identity {
                repo: repo.to_string(),
                revision: revision.to_string(),
            }))
        }
        _ => Err(StatementError::BadLine {
            line: 2,
            reason: format!(
                "repo {repo:?} and revision {revision:?} must be a canonical owner/name and 40 lowercase hex digits, or both `-`"
            ),
        }),
    }
}

fn file_line(line: &str) -> Result<(String, Listed), String> {
    let mut parts = line.splitn(3, ' ');
    let (Some(hex), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected `SHA256 SIZE PATH`".into());
    };
    let Some(FileDigest::Sha256(sha256)) = FileDigest::parse("sha256", hex) else {
        return Err(format!("{hex:?} is not 64 lowercase hex digits"));
    };
    let size: u64 = size
        .parse()
        .map_err(|_| format!("{size:?} is not a decimal size"))?;
    check_repo_path(path).map_err(|e| e.to_string())?;
    Ok((path.to_string(), Listed { size, sha256 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Statement {
        let listed = |byte: u8, size| Listed {
            size,
            sha256: [byte; 32],
        };
        Statement {
            identity: Some(Identity {
                repo: "owner/model".into(),
                revision: "0123456789abcdef0123456789abcdef01234567".into(),
            }),
            files: [
                ("config.json".to_string(), listed(1, 120)),
                ("index.json".to_string(), listed(2, 3)),
                ("layer.0/manifest.json".to_string(), listed(0xab, 999)),
            ]
            .into(),
        }
    }

    #[test]
    fn the_canonical_bytes_read_back_to_the_same_statement() {
        let bytes = example().to_bytes();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(
            "minirun-statement/1\nrepo owner/model\nrevision 0123456789abcdef0123456789abcdef01234567\n0101"
        ));
        assert!(text.ends_with(&format!("{} 999 layer.0/manifest.json\n", "ab".repeat(32))));
        assert_eq!(Statement::parse(&bytes).unwrap(), example());
        let anonymous = Statement {
            identity: None,
            ..example()
        };
        let bytes = anonymous.to_bytes();
        assert!(String::from_utf8_lossy(&bytes).contains("\nrepo -\nrevision -\n"));
        assert_eq!(Statement::parse(&bytes).unwrap(), anonymous);
    }

    #[test]
    fn every_other_spelling_of_the_same_statement_is_refused() {
        let good = String::from_utf8(example().to_bytes()).unwrap();
        let hex_ab = "ab".repeat(32);
        let variants = [
            good.replace('\n', "\r\n"),
            good.trim_end().to_string(),
            good.replace(" 120 ", " 0120 "),
            good.replace(&hex_ab, &hex_ab.to_uppercase()),
            good.replace("repo owner/model", "repo  owner/model"),
            good.replace("index.json", "a.json"),
            format!("{good}\n"),
        ];
        for variant in variants {
            assert!(Statement::parse(variant.as_bytes()).is_err(), "{variant:?}");
        }
    }

    #[test]
    fn unsafe_paths_half_identities_and_other_documents_are_refused() {
        let good = String::from_utf8(example().to_bytes()).unwrap();
        let cases = [
            good.replace("index.json", "../index.json"),
            good.replace("index.json", "/etc/passwd"),
            good.replace(
                "revision 0123456789abcdef0123456789abcdef01234567",
                "revision -",
            ),
            good.replace("repo owner/model", "repo owner/model/extra"),
            good.replace("minirun-statement/1", "minirun-statement/2"),
            good.replace(" 3 index.json", " x index.json"),
        ];
        for case in cases {
            assert!(Statement::parse(case.as_bytes()).is_err(), "{case:?}");
        }
        assert_eq!(Statement::parse(&[0xff]), Err(StatementError::NotText));
    }
}
