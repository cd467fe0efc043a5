//! SSH signatures over a statement: the `sshsig` format `ssh-keygen -Y sign` writes and
//! `ssh-keygen -Y verify` checks, under minirun's own namespace.

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

use crate::allowed_signers::{AllowedSigner, matches_pattern};

/// The namespace every statement is signed in, so that a signature made for anything else
/// (a git commit, a file) never verifies as a statement, nor a statement's as anything else.
pub const NAMESPACE: &str = "minirun-artifact";

/// Who signed, as the allowed-signers file names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The principals of the allowed-signers line that holds the key.
    pub principals: String,
    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// Why a statement could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("not an OpenSSH private key: {0}")]
    NotAKey(String),
    #[error(
        "the private key is encrypted with a passphrase, which this build does not ask for: sign the statement with `ssh-keygen -Y sign -n {NAMESPACE} -f KEY minirun-statement.txt` instead"
    )]
    Encrypted,
    #[error("signing failed: {0}")]
    Signing(String),
}

/// Why a signature does not vouch for a statement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signature file is not an SSH signature: {0}")]
    NotASignature(String),
    #[error(
        "the signature was made in namespace {found:?}, not {NAMESPACE:?}: it signs something else, not an artifact statement"
    )]
    WrongNamespace { found: String },
    #[error(
        "the signing key {fingerprint} is not in the allowed signers file (or only as a certificate authority)"
    )]
    UnknownKey { fingerprint: String },
    #[error(
        "the signing key {fingerprint} is allowed (line {line}) only for namespaces {namespaces:?}, not {NAMESPACE:?}"
    )]
    NamespaceNotAllowed {
        fingerprint: String,
        line: usize,
        namespaces: Vec<String>,
    },
    #[error(
        "the signing key {fingerprint} is allowed (line {line}) only {window}; it is now {now} seconds after the epoch"
    )]
    OutsideValidity {
        fingerprint: String,
        line: usize,
        window: String,
        now: i64,
    },
    #[error(
        "the signature by {fingerprint} does not match the statement: the statement was changed after it was signed, or the signature is another statement's"
    )]
    Mismatch { fingerprint: String },
}

/// A signature just made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// What `ssh-keygen -Y sign` would write beside the statement.
    pub armored: String,
    /// The signing key's `SHA256:...` fingerprint.
    pub fingerprint: String,
}

/// Signs `statement` with the OpenSSH private key `key_text` (unencrypted).
pub fn sign(statement: &[u8], key_text: &str) -> Result<Signature, SignError> {
    let key = PrivateKey::from_openssh(key_text).map_err(|e| SignError::NotAKey(e.to_string()))?;
    if key.is_encrypted() {
        return Err(SignError::Encrypted);
    }
    let signature = key
        .sign(NAMESPACE, HashAlg::Sha512, statement)
        .map_err(|e| SignError::Signing(e.to_string()))?;
    let armored = signature
        .to_pem(LineEnding::LF)
        .map_err(|e| SignError::Signing(e.to_string()))?;
    Ok(Signature {
        armored,
        fingerprint: fingerprint(key.public_key()),
    })
}

/// The key an armored signature says it was made with, unchecked (for display).
pub fn signing_key(armored: &str) -> Result<PublicKey, VerifyError> {
    let signature =
        SshSig::from_pem(armored).map_err(|e| VerifyError::NotASignature(e.to_string()))?;
    Ok(PublicKey::from(signature.public_key().clone()))
}

pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Checks that `armored` is a signature over `statement` in [`NAMESPACE`] by a key `allowed`
/// lets sign it at `now` (seconds since the epoch), as `ssh-keygen -Y verify` would.
pub fn verify(
    statement: &[u8],
    armored: &str,
    allowed: &[AllowedSigner],
    now: i64,
) -> Result<Signer, VerifyError> {
    let signature =
        SshSig::from_pem(armored).map_err(|e| VerifyError::NotASignature(e.to_string()))?;
    if signature.namespace() != NAMESPACE {
        return Err(VerifyError::WrongNamespace {
            found: signature.namespace().to_string(),
        });
    }
    let key = PublicKey::from(signature.public_key().clone());
    let fingerprint = fingerprint(&key);
    let entry = trusted_entry(&key, allowed, now, &fingerprint)?;
    key.verify(NAMESPACE, statement, &signature)
        .map_err(|_| VerifyError::Mismatch {
            fingerprint: fingerprint.clone(),
        })?;
    Ok(Signer {
        principals: entry.principals.clone(),
        fingerprint,
    })
}

/// The first allowed-signers line holding `key` that lets it sign a statement now; when none
/// does, the reason the last candidate gave.
fn trusted_entry<'a>(
    key: &PublicKey,
    allowed: &'a [AllowedSigner],
    now: i64,
    fingerprint: &str,
) -> Result<&'a AllowedSigner, VerifyError> {
    let mut refusal = VerifyError::UnknownKey {
        fingerprint: fingerprint.to_string(),
    };
    for entry in allowed
        .iter()
        .filter(|e| !e.cert_authority && e.key.key_data() == key.key_data())
    {
        match check_entry(entry, now, fingerprint) {
            Ok(()) => return Ok(entry),
            Err(e) => refusal = e,
        }
    }
    Err(refusal)
}

fn check_entry(entry: &AllowedSigner, now: i64, fingerprint: &str) -> Result<(), VerifyError> {
    if let Some(namespaces) = &entry.namespaces
        && !namespaces.iter().any(|n| matches_pattern(n, NAMESPACE))
    {
        return Err(VerifyError::NamespaceNotAllowed {
            fingerprint: fingerprint.to_string(),
            line: entry.line,
            namespaces: namespaces.clone(),
        });
    }
    let outside = |window: String| VerifyError::OutsideValidity {
        fingerprint: fingerprint.to_string(),
        line: entry.line,
        window,
        now,
    };
    if let Some(after) = entry.valid_after
        && now < after
    {
        return Err(outside(format!("from {after} seconds after the epoch")));
    }
    if let Some(before) = entry.valid_before
        && now >= before
    {
        return Err(outside(format!(
            "until {before} seconds after the epoch (expired)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allowed_signers::parse;

    /// A test-only key, generated with `ssh-keygen -t ed25519` for these tests and published
    /// with them.
    const TEST_KEY: &str = include_str!("../testdata/publisher_ed25519");

    fn public_line(key_text: &str) -> String {
        let key = PrivateKey::from_openssh(key_text).unwrap();
        key.public_key().to_openssh().unwrap()
    }

    fn allowed(options: &str) -> Vec<AllowedSigner> {
        parse(format!("publisher@example {options} {}\n", public_line(TEST_KEY)).as_bytes())
            .unwrap()
    }

    #[test]
    fn a_signed_statement_verifies_and_names_its_signer() {
        let signed = sign(b"statement\n", TEST_KEY).unwrap();
        assert!(
            signed
                .armored
                .starts_with("-----BEGIN SSH SIGNATURE-----\n")
        );
        let signer = verify(b"statement\n", &signed.armored, &allowed(""), 0).unwrap();
        assert_eq!(signer.principals, "publisher@example");
        assert!(signer.fingerprint.starts_with("SHA256:"), "{signer:?}");
        assert_eq!(signed.fingerprint, signer.fingerprint);
        assert_eq!(
            fingerprint(&signing_key(&signed.armored).unwrap()),
            signer.fingerprint
        );
    }

    #[test]
    fn an_edited_statement_an_unknown_key_or_a_closed_window_is_refused() {
        let armored = sign(b"statement\n", TEST_KEY).unwrap().armored;
        assert!(matches!(
            verify(b"statement!\n", &armored, &allowed(""), 0),
            Err(VerifyError::Mismatch { .. })
        ));
        assert!(matches!(
            verify(b"statement\n", &armored, &[], 0),
            Err(VerifyError::UnknownKey { .. })
        ));
        assert!(matches!(
            verify(b"statement\n", &armored, &allowed("cert-authority"), 0),
            Err(VerifyError::UnknownKey { .. })
        ));
        assert!(matches!(
            verify(b"statement\n", &armored, &allowed("namespaces=\"git\""), 0),
            Err(VerifyError::NamespaceNotAllowed { .. })
        ));
        let window = allowed("valid-after=20260101Z,valid-before=20270101Z");
        let (opens, closes) = (1_767_225_600, 1_798_761_600);
        assert!(verify(b"statement\n", &armored, &window, opens).is_ok());
        for now in [opens - 1, closes] {
            assert!(matches!(
                verify(b"statement\n", &armored, &window, now),
                Err(VerifyError::OutsideValidity { .. })
            ));
        }
    }

    #[test]
    fn a_signature_in_another_namespace_is_refused() {
        let key = PrivateKey::from_openssh(TEST_KEY).unwrap();
        let git = key.sign("git", HashAlg::Sha512, b"statement\n").unwrap();
        let armored = git.to_pem(LineEnding::LF).unwrap();
        assert_eq!(
            verify(b"statement\n", &armored, &allowed(""), 0),
            Err(VerifyError::WrongNamespace {
                found: "git".into()
            })
        );
    }
}
