//! What the publisher's tree says a file's bytes hash to, and hashing a stream both ways.

use std::fmt;

use sha1::Digest as _;

/// A file's published digest: SHA-256 for LFS files (`lfs.oid`), git-blob SHA-1 for files
/// kept in git (`oid`). Never converted into each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileDigest {
    Sha256([u8; 32]),
    GitBlobSha1([u8; 20]),
}

impl FileDigest {
    /// `sha256` or `git-blob-sha1`.
    pub fn algorithm(&self) -> &'static str {
        match self {
            FileDigest::Sha256(_) => "sha256",
            FileDigest::GitBlobSha1(_) => "git-blob-sha1",
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            FileDigest::Sha256(b) => b,
            FileDigest::GitBlobSha1(b) => b,
        }
    }

    pub fn hex(&self) -> String {
        crate::tile::hex(self.bytes())
    }

    /// Parses lowercase (or uppercase, lowered) hex of the algorithm's exact length.
    pub fn parse(algorithm: &str, hex: &str) -> Option<FileDigest> {
        match algorithm {
            "sha256" => parse_hex::<32>(hex).map(FileDigest::Sha256),
            "git-blob-sha1" => parse_hex::<20>(hex).map(FileDigest::GitBlobSha1),
            _ => None,
        }
    }
}

impl fmt::Display for FileDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm(), self.hex())
    }
}

pub(crate) fn parse_hex<const N: usize>(hex: &str) -> Option<[u8; N]> {
    if hex.len() != 2 * N || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Hashes a stream of known total length the way `expected` is defined.
pub struct StreamHasher {
    state: State,
}

enum State {
    Sha256(sha2::Sha256),
    GitBlob(sha1::Sha1),
}

impl StreamHasher {
    /// A hasher for content of `size` bytes checked against `expected`'s algorithm.
    pub fn new(expected: &FileDigest, size: u64) -> Self {
        let state = match expected {
            FileDigest::Sha256(_) => State::Sha256(sha2::Sha256::new()),
            FileDigest::GitBlobSha1(_) => {
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                State::GitBlob(h)
            }
        };
        StreamHasher { state }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.state {
            State::Sha256(h) => h.update(bytes),
            State::GitBlob(h) => h.update(bytes),
        }
    }

    pub fn finish(self) -> FileDigest {
        match self.state {
            State::Sha256(h) => FileDigest::Sha256(h.finalize().into()),
            State::GitBlob(h) => FileDigest::GitBlobSha1(h.finalize().into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_blob(content: &[u8]) -> String {
        let expected = FileDigest::GitBlobSha1([0; 20]);
        let mut h = StreamHasher::new(&expected, content.len() as u64);
        h.update(content);
        h.finish().hex()
    }

    #[test]
    fn git_blob_sha1_matches_git() {
        // `git hash-object` of "hello world" (no newline) and of an empty file.
        assert_eq!(
            git_blob(b"hello world"),
            "95d09f2b10159347eece71399a7e2e907ea3df4f"
        );
        assert_eq!(git_blob(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }

    #[test]
    fn digests_parse_only_their_exact_length() {
        let hex = "4a79cdabdab6826b994aff69d90a72aa35dae32e90f8acaf1ce312c7bdc4a487";
        let d = FileDigest::parse("sha256", hex).unwrap();
        assert_eq!(d.hex(), hex);
        assert_eq!(d.to_string(), format!("sha256:{hex}"));
        assert!(FileDigest::parse("sha256", &hex[..40]).is_none());
        assert!(FileDigest::parse("git-blob-sha1", &hex[..40]).is_some());
        assert!(FileDigest::parse("md5", &hex[..32]).is_none());
        assert!(FileDigest::parse("sha256", &hex.replace('a', "g")).is_none());
    }
}
