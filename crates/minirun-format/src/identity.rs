//! The tokenizer and configuration identity objects an `index.json` may publish.
//!
//! These are execution evidence, not display metadata: a runner opens exactly the root file
//! they name and checks it against the recorded length and digest. They are therefore parsed
//! fail-closed and all-or-nothing. Every required field must be well formed or the whole
//! identity is absent, with an [`IdentityAbsent`] that names the first field that broke a rule.
//! Nothing is defaulted and nothing is partly filled in: a provenance completed by a defaulting
//! rule is a provenance nobody published.
//!
//! Keys this module does not read are ignored, so a publisher may add fields without changing
//! the identity. That includes a `license` key on a configuration object: the configuration
//! carries five fields, and a sixth is neither required nor kept.
//!
//! ```
//! use minirun_format::identity::{parse_tokenizer, IdentityField};
//!
//! let value = serde_json::json!({
//!     "file": "tokenizer.json", "bytes": 6367146,
//!     "sha256": "AB".repeat(32),
//!     "source_repo": "deepseek-ai/DeepSeek-V4-Flash-0731",
//!     "source_revision": "7872f01b1d1fe23eabc4c98b48bffcef5a386062",
//!     "license": "LICENSE",
//! });
//! let identity = parse_tokenizer(&value).unwrap();
//! assert_eq!(identity.sha256, "ab".repeat(32));
//!
//! let mut broken = value.clone();
//! broken["file"] = "../tokenizer.json".into();
//! let absent = parse_tokenizer(&broken).unwrap_err();
//! assert_eq!(absent.field, IdentityField::File);
//! assert_eq!(absent.to_string(), "file: not a canonical repository-root file name");
//! ```

use serde::Serialize;
use serde_json::{Map, Value};

/// The tokenizer file an artifact publishes at its repository root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenizerIdentity {
    /// A canonical repository-root file name (see [`is_canonical_root_file_name`]).
    pub file: String,
    /// The recorded length of `file`, positive.
    pub bytes: u64,
    /// The recorded SHA-256 of `file`, 64 lowercase hexadecimal characters.
    pub sha256: String,
    /// The upstream repository the tokenizer came from (see [`is_canonical_repo_id`]).
    pub source_repo: String,
    /// The upstream commit, 40 lowercase hexadecimal characters.
    pub source_revision: String,
    /// The root file holding the tokenizer's licence, under the same rule as `file`.
    pub license: String,
}

/// The model configuration file an artifact publishes at its repository root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigurationIdentity {
    /// A canonical repository-root file name (see [`is_canonical_root_file_name`]).
    pub file: String,
    /// The recorded length of `file`, positive.
    pub bytes: u64,
    /// The recorded SHA-256 of `file`, 64 lowercase hexadecimal characters.
    pub sha256: String,
    /// The upstream repository the configuration came from.
    pub source_repo: String,
    /// The upstream commit, 40 lowercase hexadecimal characters.
    pub source_revision: String,
}

/// Which part of an identity object broke a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityField {
    /// The identity value itself, which must be a JSON object.
    Object,
    /// The `file` key.
    File,
    /// The `bytes` key.
    Bytes,
    /// The `sha256` key.
    Sha256,
    /// The `source_repo` key.
    SourceRepo,
    /// The `source_revision` key.
    SourceRevision,
    /// The `license` key (tokenizer only).
    License,
}

impl IdentityField {
    /// The key as the document spells it (`"identity"` for the object itself).
    pub fn key(self) -> &'static str {
        match self {
            IdentityField::Object => "identity",
            IdentityField::File => "file",
            IdentityField::Bytes => "bytes",
            IdentityField::Sha256 => "sha256",
            IdentityField::SourceRepo => "source_repo",
            IdentityField::SourceRevision => "source_revision",
            IdentityField::License => "license",
        }
    }
}

impl std::fmt::Display for IdentityField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// The rule a field broke. Each variant's text is the sentence a user sees after the field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum BrokenRule {
    /// The identity value is not a JSON object.
    #[error("not a JSON object")]
    NotAnObject,
    /// A required key is not in the object.
    #[error("missing")]
    Missing,
    /// The value is not a JSON string.
    #[error("not a string")]
    NotAString,
    /// Not a non-empty name of letters, digits, `.`, `_`, `-`, or it is `.` or `..`.
    #[error("not a canonical repository-root file name")]
    NotRootFileName,
    /// Not a JSON integer above zero (booleans, strings, fractions and exponents all fail).
    #[error("not a positive integer")]
    NotPositiveInteger,
    /// Not exactly 64 hexadecimal characters.
    #[error("not 64 hex characters")]
    NotSha256,
    /// Not a Hugging Face repository id of the form `owner/name`.
    #[error("not a canonical owner/name repository id")]
    NotRepoId,
    /// Not exactly 40 lowercase hexadecimal characters (a branch name is not a commit).
    #[error("not a pinned 40-character lowercase hex commit")]
    NotPinnedRevision,
}

/// Why an identity object was not accepted: the first field, in reading order, that broke a rule.
///
/// Fields are read in the order `file`, `bytes`, `sha256`, `source_repo`, `source_revision`,
/// `license`; a later field is not looked at once an earlier one has failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct IdentityAbsent {
    /// The field that broke the rule.
    pub field: IdentityField,
    /// The rule it broke.
    pub rule: BrokenRule,
}

impl IdentityAbsent {
    fn new(field: IdentityField, rule: BrokenRule) -> Self {
        IdentityAbsent { field, rule }
    }
}

/// Parses a tokenizer object: the five shared fields plus `license`, all required.
pub fn parse_tokenizer(value: &Value) -> Result<TokenizerIdentity, IdentityAbsent> {
    let object = as_object(value)?;
    let common = CommonFields::parse(object)?;
    let license = root_file_name(object, IdentityField::License)?;
    Ok(TokenizerIdentity {
        file: common.file,
        bytes: common.bytes,
        sha256: common.sha256,
        source_repo: common.source_repo,
        source_revision: common.source_revision,
        license,
    })
}

/// Parses a configuration object: the five shared fields. A `license` key, if any, is ignored.
pub fn parse_configuration(value: &Value) -> Result<ConfigurationIdentity, IdentityAbsent> {
    let object = as_object(value)?;
    let common = CommonFields::parse(object)?;
    Ok(ConfigurationIdentity {
        file: common.file,
        bytes: common.bytes,
        sha256: common.sha256,
        source_repo: common.source_repo,
        source_revision: common.source_revision,
    })
}

/// Whether `name` is a canonical repository-root file name.
///
/// Non-empty, only ASCII letters, digits, `.`, `_` and `-`, and neither `.` nor `..`. The
/// character set already excludes `/`, `\`, whitespace, controls and every non-ASCII lookalike,
/// so such a name can be joined to an artifact root without escaping it.
///
/// ```
/// use minirun_format::identity::is_canonical_root_file_name;
/// assert!(is_canonical_root_file_name("tiktoken.model"));
/// assert!(!is_canonical_root_file_name(".."));
/// assert!(!is_canonical_root_file_name("a/b"));
/// ```
pub fn is_canonical_root_file_name(name: &str) -> bool {
    is_canonical_component(name)
}

/// Whether `id` is a canonical Hugging Face repository id: exactly `owner/name`, where each part
/// is a canonical component (the same rule as [`is_canonical_root_file_name`]).
///
/// Percent escapes, backslashes, whitespace and Unicode lookalikes are refused rather than left
/// for a URL layer and a file system to interpret differently.
///
/// ```
/// use minirun_format::identity::is_canonical_repo_id;
/// assert!(is_canonical_repo_id("moonshotai/Kimi-K3"));
/// assert!(!is_canonical_repo_id("moonshotai/Kimi-K3/extra"));
/// assert!(!is_canonical_repo_id("Kimi-K3"));
/// ```
pub fn is_canonical_repo_id(id: &str) -> bool {
    match id.split_once('/') {
        Some((owner, name)) => is_canonical_component(owner) && is_canonical_component(name),
        None => false,
    }
}

/// Whether `revision` names an immutable commit: exactly 40 lowercase hexadecimal characters.
///
/// A branch name such as `main` is refused, because the bytes behind it can change.
///
/// ```
/// use minirun_format::identity::is_pinned_revision;
/// assert!(is_pinned_revision("9f62e4e9fffbd0a83ddd60e1c209d828994b3569"));
/// assert!(!is_pinned_revision("main"));
/// assert!(!is_pinned_revision("9F62E4E9FFFBD0A83DDD60E1C209D828994B3569"));
/// ```
pub fn is_pinned_revision(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(is_lowercase_hex_digit)
}

/// Whether `digest` is a SHA-256 written as exactly 64 hexadecimal characters of either case.
pub fn is_sha256_hex(digest: &str) -> bool {
    digest.len() == 64 && digest.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// `value` as an unsigned JSON integer that fits a `u64`, zero included.
///
/// Shared with the index reader's count rules; the identity's `bytes` also requires it above zero.
pub(crate) fn unsigned_integer(value: &Value) -> Option<u64> {
    // `as_u64` is `None` for booleans, strings, negative numbers and any number written with
    // a fraction or an exponent, which serde_json keeps as a float even when it is integral.
    value.as_u64()
}

/// The five fields the tokenizer and configuration objects share, already validated.
struct CommonFields {
    file: String,
    bytes: u64,
    sha256: String,
    source_repo: String,
    source_revision: String,
}

impl CommonFields {
    fn parse(object: &Map<String, Value>) -> Result<Self, IdentityAbsent> {
        Ok(CommonFields {
            file: root_file_name(object, IdentityField::File)?,
            bytes: positive_bytes(object)?,
            sha256: sha256_lowercase(object)?,
            source_repo: repo_id(object)?,
            source_revision: pinned_revision(object)?,
        })
    }
}

fn as_object(value: &Value) -> Result<&Map<String, Value>, IdentityAbsent> {
    value.as_object().ok_or(IdentityAbsent::new(
        IdentityField::Object,
        BrokenRule::NotAnObject,
    ))
}

fn required(object: &Map<String, Value>, field: IdentityField) -> Result<&Value, IdentityAbsent> {
    object
        .get(field.key())
        .ok_or(IdentityAbsent::new(field, BrokenRule::Missing))
}

fn required_str(object: &Map<String, Value>, field: IdentityField) -> Result<&str, IdentityAbsent> {
    required(object, field)?
        .as_str()
        .ok_or(IdentityAbsent::new(field, BrokenRule::NotAString))
}

/// A string field that must pass `rule_holds`, or be reported as breaking `rule`.
fn checked_str(
    object: &Map<String, Value>,
    field: IdentityField,
    rule_holds: fn(&str) -> bool,
    rule: BrokenRule,
) -> Result<String, IdentityAbsent> {
    let text = required_str(object, field)?;
    if rule_holds(text) {
        Ok(text.to_owned())
    } else {
        Err(IdentityAbsent::new(field, rule))
    }
}

fn root_file_name(
    object: &Map<String, Value>,
    field: IdentityField,
) -> Result<String, IdentityAbsent> {
    checked_str(
        object,
        field,
        is_canonical_root_file_name,
        BrokenRule::NotRootFileName,
    )
}

fn positive_bytes(object: &Map<String, Value>) -> Result<u64, IdentityAbsent> {
    let field = IdentityField::Bytes;
    match unsigned_integer(required(object, field)?) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(IdentityAbsent::new(field, BrokenRule::NotPositiveInteger)),
    }
}

fn sha256_lowercase(object: &Map<String, Value>) -> Result<String, IdentityAbsent> {
    let digest = checked_str(
        object,
        IdentityField::Sha256,
        is_sha256_hex,
        BrokenRule::NotSha256,
    )?;
    Ok(digest.to_ascii_lowercase())
}

fn repo_id(object: &Map<String, Value>) -> Result<String, IdentityAbsent> {
    checked_str(
        object,
        IdentityField::SourceRepo,
        is_canonical_repo_id,
        BrokenRule::NotRepoId,
    )
}

fn pinned_revision(object: &Map<String, Value>) -> Result<String, IdentityAbsent> {
    checked_str(
        object,
        IdentityField::SourceRevision,
        is_pinned_revision,
        BrokenRule::NotPinnedRevision,
    )
}

fn is_canonical_component(part: &str) -> bool {
    !part.is_empty() && part != "." && part != ".." && part.bytes().all(is_canonical_name_byte)
}

fn is_canonical_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

fn is_lowercase_hex_digit(byte: u8) -> bool {
    byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)
}
