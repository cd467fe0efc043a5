//! A fresh Ed25519 signing key in OpenSSH's formats, for a publisher (or `minirun quickstart`)
//! that has none: its private key as `ssh-keygen` writes one (unencrypted), its public key line,
//! and the `allowed_signers` line that lets `minirun verify` (and `ssh-keygen -Y verify`) accept
//! its signatures.

use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{LineEnding, PrivateKey};

use crate::signature::{NAMESPACE, SignError};

/// A new key's three texts.
pub struct NewKey {
    /// The private key, OpenSSH's PEM-like format.
    pub private_openssh: String,
    /// `ssh-ed25519 BASE64 COMMENT`.
    pub public_line: String,
    /// `PRINCIPAL namespaces="minirun-artifact" ssh-ed25519 BASE64`.
    pub allowed_signers_line: String,
}

/// The Ed25519 key of the 32-byte `seed` (from the system's random source: the key is as
/// secret as the seed), named `principal` in its comment and its allowed-signers line.
pub fn ed25519_key(seed: &[u8; 32], principal: &str) -> Result<NewKey, SignError> {
    let keypair = KeypairData::Ed25519(Ed25519Keypair::from_seed(seed));
    let key = PrivateKey::new(keypair, principal).map_err(|e| SignError::Signing(e.to_string()))?;
    let private_openssh = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| SignError::Signing(e.to_string()))?
        .to_string();
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| SignError::Signing(e.to_string()))?;
    let bare = public
        .rsplit_once(' ')
        .map_or(public.as_str(), |(key, _)| key);
    Ok(NewKey {
        private_openssh,
        allowed_signers_line: format!("{principal} namespaces=\"{NAMESPACE}\" {bare}\n"),
        public_line: format!("{public}\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allowed_signers;
    use crate::signature::{sign, verify};

    #[test]
    fn a_new_key_signs_what_its_allowed_signers_line_accepts() {
        let key = ed25519_key(&[7; 32], "publisher@example").unwrap();
        assert!(
            key.private_openssh
                .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
        );
        assert!(key.public_line.starts_with("ssh-ed25519 "));
        assert!(key.public_line.trim_end().ends_with(" publisher@example"));
        let signers = allowed_signers::parse(key.allowed_signers_line.as_bytes()).unwrap();
        let statement = b"a statement";
        let signed = sign(statement, &key.private_openssh).unwrap();
        assert!(verify(statement, &signed.armored, &signers, 0).is_ok());
        // Another seed is another key, which the first one's line does not accept.
        let other = ed25519_key(&[8; 32], "publisher@example").unwrap();
        let forged = sign(statement, &other.private_openssh).unwrap();
        assert!(verify(statement, &forged.armored, &signers, 0).is_err());
    }
}
