//! A minirun artifact's signed statement: what a publisher signs ([`statement`]), the SSH
//! signature over it ([`signature`], the `sshsig` format of `ssh-keygen -Y sign`) and the
//! allowed-signers file that says whose signatures to trust ([`allowed_signers`]). Pure
//! functions over bytes: reading the artifact's files is the store's and the CLI's job.

pub mod allowed_signers;
pub mod new_key;
pub mod signature;
pub mod statement;

pub use allowed_signers::{AllowedSigner, AllowedSignersError};
pub use new_key::{NewKey, ed25519_key};
pub use signature::{NAMESPACE, SignError, Signature, Signer, VerifyError};
pub use statement::{Identity, Listed, SIGNATURE_FILE, STATEMENT_FILE, Statement, StatementError};
