//! An artifact's root `index.json`: which of the published shapes it has, which upstream
//! repositories it names, what payload it claims, and which tokenizer and configuration it pins.
//!
//! The document has no schema version. Three shapes exist across the published artifacts and
//! each is recognised by what it carries ([`IndexShape`]); anything else is
//! [`IndexShape::Unrecognized`] and keeps its sorted top-level keys, so an operator sees what the
//! document held instead of a guess. Spec: `docs/formats/index-json.md`.
//!
//! [`ArtifactIndex::parse`] never fails and never panics. An index that cannot be read describes
//! an artifact whose identity is unknown, which `minirun info` can show; an error or a panic in
//! the middle of a directory walk would hide every other artifact on the volume.
//!
//! ```
//! use minirun_format::index::{ArtifactIndex, IndexShape};
//!
//! let index = ArtifactIndex::parse(br#"{"source_repo": "moonshotai/Kimi-K3",
//!     "files": 372, "bytes": 1559976181760}"#);
//! assert_eq!(index.shape, IndexShape::SingleSourceTotals);
//! assert_eq!(index.files, Some(372));
//!
//! let broken = ArtifactIndex::parse(b"{\"source_repo\": ");
//! assert_eq!(broken.shape, IndexShape::Unrecognized);
//! assert!(broken.parse_problem.is_some());
//! ```

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::identity::{
    ConfigurationIdentity, IdentityAbsent, TokenizerIdentity, parse_configuration, parse_tokenizer,
    unsigned_integer,
};

/// The largest `index.json` this reader parses. The published ones are under 30 KB; the bound
/// keeps a hostile or corrupt file from costing more than a bounded amount of memory.
pub const MAX_INDEX_BYTES: usize = 64 * 1024 * 1024;

/// The largest payload file count a claim may state. The reference implementation holds the
/// count in a signed 64-bit integer and refuses a larger one; so does this reader.
const MAX_CLAIMED_FILES: u64 = i64::MAX as u64;

/// Which published `index.json` shape a document has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IndexShape {
    /// One upstream `source_repo`, totals at the top level, no `units` array (Kimi K3).
    SingleSourceTotals,
    /// One upstream `source_repo` and a `units` array (DeepSeek V4 Flash).
    SingleSourceUnits,
    /// A `sources` map of several upstreams (MiniMax H3).
    MultiSourceUnits,
    /// Not readable, not an object, or names no repository this reader understands.
    Unrecognized,
}

impl IndexShape {
    /// The shape's name, as it is serialized.
    pub fn name(self) -> &'static str {
        match self {
            IndexShape::SingleSourceTotals => "single-source-totals",
            IndexShape::SingleSourceUnits => "single-source-units",
            IndexShape::MultiSourceUnits => "multi-source-units",
            IndexShape::Unrecognized => "unrecognized",
        }
    }

    /// One line that says what the shape means, for a person.
    pub fn explanation(self) -> &'static str {
        match self {
            IndexShape::SingleSourceTotals => {
                "one upstream repository; file and byte totals stated at the top level"
            }
            IndexShape::SingleSourceUnits => {
                "one upstream repository; payload broken down into a units list"
            }
            IndexShape::MultiSourceUnits => {
                "several upstream repositories in a sources map, each with its role"
            }
            IndexShape::Unrecognized => {
                "names no repository this reader understands; the artifact is unidentified"
            }
        }
    }
}

/// One upstream repository the index names.
///
/// Nothing here is defaulted except a multi-source entry's role, which is its map key when the
/// entry states none (the reference implementation's rule).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Source {
    /// The `sources` map key (multi-source only).
    pub key: Option<String>,
    /// The repository id, verbatim and non-empty. Not checked for canonical form: this is display
    /// provenance, unlike the repository ids in the identity objects.
    pub repo: String,
    /// `source_revision` or the entry's `revision`, when that is a string.
    pub revision: Option<String>,
    /// The entry's `role`, or its key (multi-source only).
    pub role: Option<String>,
    /// The entry's `license`, when that is a string (multi-source only).
    pub license: Option<String>,
}

/// What one `units[]` entry says about itself. Only what the entry states is filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitSummary {
    /// The entry's `unit` string.
    pub name: Option<String>,
    /// The entry's `files`, when it is an unsigned integer.
    pub files: Option<u64>,
    /// The entry's `bytes`, when it is an unsigned integer.
    pub bytes: Option<u64>,
}

/// Everything an `index.json` is willing to say about its artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactIndex {
    /// Which shape the document has.
    pub shape: IndexShape,
    /// The upstream repositories it names: one for the single-source shapes, the valid entries
    /// sorted by key for the multi-source shape, none when unrecognized.
    pub sources: Vec<Source>,
    /// Claimed payload file count. Set together with `bytes` or not at all.
    pub files: Option<u64>,
    /// Claimed payload byte count. Set together with `files` or not at all.
    pub bytes: Option<u64>,
    /// `format`, when it is a string.
    pub format: Option<String>,
    /// `format_version`, when it is an unsigned integer.
    pub format_version: Option<u64>,
    /// `relationship`, the publisher's sentence about the repack, when it is a string.
    pub relationship: Option<String>,
    /// One summary per `units[]` element, in document order; empty when there is no array.
    pub units: Vec<UnitSummary>,
    /// Every top-level key, sorted by code point; empty when the document is not an object.
    pub top_level_keys: Vec<String>,
    /// `None` when there is no `tokenizer` key; otherwise the fail-closed parse of its value.
    #[serde(serialize_with = "serialize_identity")]
    pub tokenizer: Option<Result<TokenizerIdentity, IdentityAbsent>>,
    /// `None` when there is no `configuration` key; otherwise the fail-closed parse of its value.
    #[serde(serialize_with = "serialize_identity")]
    pub configuration: Option<Result<ConfigurationIdentity, IdentityAbsent>>,
    /// Why the bytes could not be read as a JSON object, when they could not.
    pub parse_problem: Option<String>,
}

impl ArtifactIndex {
    /// Reads an `index.json` body. Never fails: unreadable input gives an
    /// [`IndexShape::Unrecognized`] index with [`parse_problem`](Self::parse_problem) set.
    pub fn parse(bytes: &[u8]) -> ArtifactIndex {
        match read_object(bytes) {
            Ok(root) => Self::from_object(&root),
            Err(problem) => Self::unreadable(problem),
        }
    }

    /// Several lines of text for `minirun info`. Strings from the document are shown with their
    /// control characters escaped, so an index cannot rewrite the terminal it is printed on.
    pub fn describe(&self) -> String {
        let mut lines = vec![format!(
            "shape: {} ({})",
            self.shape.name(),
            self.shape.explanation()
        )];
        if let Some(problem) = &self.parse_problem {
            lines.push(format!("parse problem: {}", shown(problem)));
            return lines.join("\n");
        }
        if self.shape == IndexShape::Unrecognized {
            lines.push(format!("top-level keys: {}", self.keys_line()));
        }
        self.describe_sources(&mut lines);
        lines.push(format!("payload files: {}", claimed(self.files)));
        lines.push(format!("payload bytes: {}", claimed(self.bytes)));
        lines.push(format!("format: {}", self.format_line()));
        lines.push(format!("relationship: {}", stated(&self.relationship)));
        lines.push(format!("units: {}", self.units_line()));
        lines.push(format!(
            "tokenizer: {}",
            identity_line(&self.tokenizer, tokenizer_line)
        ));
        lines.push(format!(
            "configuration: {}",
            identity_line(&self.configuration, configuration_line)
        ));
        lines.join("\n")
    }

    fn unreadable(problem: String) -> ArtifactIndex {
        ArtifactIndex {
            shape: IndexShape::Unrecognized,
            sources: Vec::new(),
            files: None,
            bytes: None,
            format: None,
            format_version: None,
            relationship: None,
            units: Vec::new(),
            top_level_keys: Vec::new(),
            tokenizer: None,
            configuration: None,
            parse_problem: Some(problem),
        }
    }

    fn from_object(root: &Map<String, Value>) -> ArtifactIndex {
        let (shape, sources) = recognize(root);
        let claim = read_claim(root);
        ArtifactIndex {
            shape,
            sources,
            files: claim.map(|claim| claim.files),
            bytes: claim.map(|claim| claim.bytes),
            format: string_field(root, "format"),
            format_version: root.get("format_version").and_then(unsigned_integer),
            relationship: string_field(root, "relationship"),
            units: unit_summaries(root),
            top_level_keys: sorted_keys(root),
            tokenizer: root.get("tokenizer").map(parse_tokenizer),
            configuration: root.get("configuration").map(parse_configuration),
            parse_problem: None,
        }
    }

    fn describe_sources(&self, lines: &mut Vec<String>) {
        match self.sources.as_slice() {
            [] => lines.push("sources: none named".to_owned()),
            [only] if only.key.is_none() => lines.push(format!("source: {}", repo_at(only))),
            all => {
                lines.push(format!("sources ({}):", all.len()));
                for source in all {
                    describe_source_entry(source, lines);
                }
            }
        }
    }

    fn keys_line(&self) -> String {
        if self.top_level_keys.is_empty() {
            return "none".to_owned();
        }
        let keys: Vec<String> = self.top_level_keys.iter().map(|key| shown(key)).collect();
        keys.join(", ")
    }

    fn format_line(&self) -> String {
        match (&self.format, self.format_version) {
            (Some(format), Some(version)) => format!("{} (version {version})", shown(format)),
            (Some(format), None) => shown(format),
            (None, Some(version)) => format!("not stated (format_version {version})"),
            (None, None) => "not stated".to_owned(),
        }
    }

    fn units_line(&self) -> String {
        match self.units.len() {
            0 => "none listed".to_owned(),
            count => count.to_string(),
        }
    }
}

/// Bytes to a JSON object, or the one sentence that says why not.
fn read_object(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    if bytes.len() > MAX_INDEX_BYTES {
        return Err(format!(
            "the document is {} bytes, over the {MAX_INDEX_BYTES}-byte limit for an index",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|error| format!("not UTF-8: {error}"))?;
    if text.trim_matches(is_json_whitespace).is_empty() {
        return Err("the document is empty".to_owned());
    }
    // serde_json refuses nesting deeper than 128 levels with an error, so a document of ten
    // million `[` is an ordinary parse failure rather than a stack overflow.
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(root)) => Ok(root),
        Ok(other) => Err(format!(
            "the document is {}, not an object",
            json_kind(&other)
        )),
        Err(error) => Err(format!("not JSON: {error}")),
    }
}

fn is_json_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The shape and sources, by the reference implementation's rules in order: a non-empty string
/// `source_repo` wins over a `sources` map, which needs at least one valid entry.
fn recognize(root: &Map<String, Value>) -> (IndexShape, Vec<Source>) {
    if let Some(repo) = root
        .get("source_repo")
        .and_then(Value::as_str)
        .filter(|repo| !repo.is_empty())
    {
        let source = Source {
            key: None,
            repo: repo.to_owned(),
            revision: string_field(root, "source_revision"),
            role: None,
            license: None,
        };
        let shape = match root.get("units") {
            Some(Value::Array(_)) => IndexShape::SingleSourceUnits,
            _ => IndexShape::SingleSourceTotals,
        };
        return (shape, vec![source]);
    }
    let sources = match root.get("sources") {
        Some(Value::Object(map)) => multi_sources(map),
        _ => Vec::new(),
    };
    if sources.is_empty() {
        (IndexShape::Unrecognized, sources)
    } else {
        (IndexShape::MultiSourceUnits, sources)
    }
}

/// The valid entries of a `sources` map, sorted by key so that two reads of the same document
/// list them in the same order whatever order the map was written in.
fn multi_sources(map: &Map<String, Value>) -> Vec<Source> {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    keys.into_iter()
        .filter_map(|key| multi_source_entry(key, map.get(key)?))
        .collect()
}

fn multi_source_entry(key: &str, entry: &Value) -> Option<Source> {
    let entry = entry.as_object()?;
    let repo = entry
        .get("repo")
        .and_then(Value::as_str)
        .filter(|repo| !repo.is_empty())?;
    Some(Source {
        key: Some(key.to_owned()),
        repo: repo.to_owned(),
        revision: string_field(entry, "revision"),
        role: Some(string_field(entry, "role").unwrap_or_else(|| key.to_owned())),
        license: string_field(entry, "license"),
    })
}

/// The payload an index claims. Files and bytes are one claim: either both are valid or the
/// index claims nothing, as in the reference implementation.
#[derive(Debug, Clone, Copy)]
struct CountClaim {
    files: u64,
    bytes: u64,
}

fn read_claim(root: &Map<String, Value>) -> Option<CountClaim> {
    // The first present key decides: an invalid `files` does not fall back to `file_count`,
    // and a stated count of either kind is never replaced by the units' sum.
    let files = match first_present(root, &["files", "file_count"]) {
        Some(value) => unsigned_integer(value)?,
        None => unit_file_sum(root)?,
    };
    if files > MAX_CLAIMED_FILES {
        return None;
    }
    let bytes = unsigned_integer(first_present(root, &["bytes", "total_bytes"])?)?;
    Some(CountClaim { files, bytes })
}

fn first_present<'a>(root: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|key| root.get(*key))
}

/// Σ `units[].files`: entries without `files` are skipped; a non-object entry, an invalid count
/// or an overflow voids the sum. An empty array sums to zero.
fn unit_file_sum(root: &Map<String, Value>) -> Option<u64> {
    let units = root.get("units")?.as_array()?;
    units
        .iter()
        .try_fold(0_u64, |total, unit| match unit.as_object()?.get("files") {
            None => Some(total),
            Some(files) => total.checked_add(unsigned_integer(files)?),
        })
}

fn unit_summaries(root: &Map<String, Value>) -> Vec<UnitSummary> {
    let Some(units) = root.get("units").and_then(Value::as_array) else {
        return Vec::new();
    };
    units.iter().map(unit_summary).collect()
}

fn unit_summary(unit: &Value) -> UnitSummary {
    let field = |key: &str| unit.get(key).and_then(unsigned_integer);
    UnitSummary {
        name: unit.get("unit").and_then(Value::as_str).map(str::to_owned),
        files: field("files"),
        bytes: field("bytes"),
    }
}

fn string_field(object: &Map<String, Value>, key: &str) -> Option<String> {
    object.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn sorted_keys(root: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = root.keys().cloned().collect();
    keys.sort();
    keys
}

/// Serializes an optional identity as `null` (not published), `{"present": {...}}` or
/// `{"absent": "<field>: <rule>"}`.
fn serialize_identity<T, S>(
    identity: &Option<Result<T, IdentityAbsent>>,
    serializer: S,
) -> Result<S::Ok, S::Error>
where
    T: Serialize,
    S: Serializer,
{
    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Shown<'a, T> {
        Present(&'a T),
        Absent(String),
    }
    match identity {
        None => serializer.serialize_none(),
        Some(Ok(present)) => Shown::Present(present).serialize(serializer),
        Some(Err(absent)) => Shown::<T>::Absent(absent.to_string()).serialize(serializer),
    }
}

fn describe_source_entry(source: &Source, lines: &mut Vec<String>) {
    let key = source.key.as_deref().unwrap_or("source");
    lines.push(format!("  {}: {}", shown(key), repo_at(source)));
    if let Some(role) = &source.role {
        lines.push(format!("    role: {}", shown(role)));
    }
    lines.push(format!("    licence: {}", stated(&source.license)));
}

fn repo_at(source: &Source) -> String {
    match &source.revision {
        Some(revision) => format!("{} @ {}", shown(&source.repo), shown(revision)),
        None => format!("{} (no revision stated)", shown(&source.repo)),
    }
}

fn identity_line<T>(
    identity: &Option<Result<T, IdentityAbsent>>,
    present: fn(&T) -> String,
) -> String {
    match identity {
        None => "not published".to_owned(),
        Some(Ok(identity)) => present(identity),
        Some(Err(absent)) => format!("absent: {absent}"),
    }
}

// Identity fields passed the canonical-name rules, so they hold no character that needs escaping.
fn tokenizer_line(identity: &TokenizerIdentity) -> String {
    format!(
        "{}, {} B, sha256 {}, from {} @ {}, licence file {}",
        identity.file,
        grouped(identity.bytes),
        identity.sha256,
        identity.source_repo,
        identity.source_revision,
        identity.license
    )
}

fn configuration_line(identity: &ConfigurationIdentity) -> String {
    format!(
        "{}, {} B, sha256 {}, from {} @ {}",
        identity.file,
        grouped(identity.bytes),
        identity.sha256,
        identity.source_repo,
        identity.source_revision
    )
}

fn claimed(count: Option<u64>) -> String {
    count.map_or_else(|| "not claimed".to_owned(), grouped)
}

fn stated(text: &Option<String>) -> String {
    text.as_deref()
        .map_or_else(|| "not stated".to_owned(), shown)
}

/// `1559976181760` as `1,559,976,181,760`.
fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Document text made safe to print: control characters and bidirectional overrides escaped.
fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}
