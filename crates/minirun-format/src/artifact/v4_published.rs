//! The published DeepSeek V4 artifact's own layout (`nanguoyu/DeepSeek-V4-Flash-0731-minirun`):
//! units `layersNN`, `global00` and `mtpNN`, each with a `manifest.json` listing its payload
//! files: version-3 FP8 containers holding one whole matrix each (named by `source_tensor`),
//! version-2 MXFP4 expert containers `<unit>-w1/w3/w2.mxfp4tile` with one expert per tile in the
//! order `expert_order` gives, and unaligned mixed-dtype plain blobs whose members tile the file.
//!
//! Pure rules: parse and check a unit manifest. Spec: `docs/formats/v4-published.md`.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::tree::check_repo_path;

/// The largest unit manifest read (V4 Flash's are about 11 KB).
pub const MAX_MANIFEST_BYTES: usize = 8 << 20;
/// Files in one unit, members in one blob: far above V4's (13, a few dozen).
pub const MAX_ENTRIES: usize = 1 << 16;
/// The expert containers of a layer unit, by projection.
pub const EXPERT_PROJECTIONS: [&str; 3] = ["w1", "w3", "w2"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum V4LayoutError {
    #[error("{unit}/manifest.json: {reason}")]
    Manifest { unit: String, reason: String },
    #[error("{unit}/manifest.json: file {file}: {reason}")]
    File {
        unit: String,
        file: String,
        reason: String,
    },
}

/// A plain tensor's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainDtype {
    Bf16,
    F32,
    I64,
}

impl PlainDtype {
    pub fn width(self) -> u64 {
        match self {
            PlainDtype::Bf16 => 2,
            PlainDtype::F32 => 4,
            PlainDtype::I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PlainDtype::Bf16 => "BF16",
            PlainDtype::F32 => "F32",
            PlainDtype::I64 => "I64",
        }
    }

    fn parse(s: &str) -> Option<PlainDtype> {
        match s {
            "BF16" => Some(PlainDtype::Bf16),
            "F32" => Some(PlainDtype::F32),
            "I64" => Some(PlainDtype::I64),
            _ => None,
        }
    }
}

/// One tensor of a plain blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainTensor {
    pub name: String,
    pub dtype: PlainDtype,
    pub shape: Vec<u64>,
    pub offset: u64,
    pub bytes: u64,
}

/// A container's geometry as the manifest states it (checked against its header by readers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEntry {
    pub name: String,
    pub bytes: u64,
    pub rows: u32,
    pub cols: u32,
    pub count: u32,
    pub element_bits: u32,
    pub group: u32,
    pub block_rows: Option<u32>,
    /// `mxfp4` or `fp8-e4m3-block`.
    pub layout: String,
    /// The matrix an FP8 container holds; routed-expert containers name none.
    pub source_tensor: Option<String>,
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum V4File {
    Container(ContainerEntry),
    Blob {
        name: String,
        bytes: u64,
        sha256: String,
        /// Gapless from offset 0, summing to `bytes`; one covering the file for a standalone
        /// tensor.
        tensors: Vec<PlainTensor>,
    },
}

impl V4File {
    pub fn name(&self) -> &str {
        match self {
            V4File::Container(c) => &c.name,
            V4File::Blob { name, .. } => name,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            V4File::Container(c) => c.bytes,
            V4File::Blob { bytes, .. } => *bytes,
        }
    }
}

/// A unit's `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V4UnitManifest {
    pub unit: String,
    pub source_repo: String,
    pub source_revision: String,
    pub files: Vec<V4File>,
    /// `expert_order[i]` = the expert tile i holds (layer units).
    pub expert_order: Option<Vec<u32>>,
}

/// What kind of unit a directory name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// `layersNN`: layer NN (at least two digits).
    Layer(usize),
    Global,
    /// `mtpNN`: a multi-token-prediction stage, verified and not run.
    Mtp(usize),
}

impl UnitKind {
    pub fn of(unit: &str) -> Option<UnitKind> {
        let number = |digits: &str| {
            (digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        };
        if unit == "global00" {
            return Some(UnitKind::Global);
        }
        if let Some(d) = unit.strip_prefix("layers") {
            return number(d).map(UnitKind::Layer);
        }
        unit.strip_prefix("mtp").and_then(number).map(UnitKind::Mtp)
    }

    /// The layer unit's directory name.
    pub fn layer_unit(layer: usize) -> String {
        format!("layers{layer:02}")
    }
}

struct Ctx<'a> {
    unit: &'a str,
}

impl Ctx<'_> {
    fn bad(&self, reason: impl Into<String>) -> V4LayoutError {
        V4LayoutError::Manifest {
            unit: self.unit.to_string(),
            reason: reason.into(),
        }
    }

    fn file(&self, file: &str, reason: impl Into<String>) -> V4LayoutError {
        V4LayoutError::File {
            unit: self.unit.to_string(),
            file: file.to_string(),
            reason: reason.into(),
        }
    }
}

fn string<'v>(m: &'v Map<String, Value>, key: &str) -> Option<&'v str> {
    m.get(key).and_then(Value::as_str)
}

fn unsigned(m: &Map<String, Value>, key: &str) -> Option<u64> {
    m.get(key).and_then(Value::as_u64)
}

fn small(m: &Map<String, Value>, key: &str) -> Option<u32> {
    unsigned(m, key).and_then(|v| u32::try_from(v).ok())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl V4UnitManifest {
    /// Parses and checks the manifest of unit `unit` (its directory name).
    pub fn parse(bytes: &[u8], unit: &str) -> Result<V4UnitManifest, V4LayoutError> {
        let ctx = Ctx { unit };
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ctx.bad(format!(
                "{} bytes, more than the {MAX_MANIFEST_BYTES} a unit manifest may have",
                bytes.len()
            )));
        }
        let kind = UnitKind::of(unit)
            .ok_or_else(|| ctx.bad("is not a layersNN, global00 or mtpNN unit"))?;
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| ctx.bad(format!("is not JSON: {e}")))?;
        let top = value
            .as_object()
            .ok_or_else(|| ctx.bad("is not an object"))?;
        if string(top, "unit") != Some(unit) {
            return Err(ctx.bad(format!(
                "its unit is {:?}, its directory {unit}",
                top.get("unit")
            )));
        }
        let source = |key: &str| match string(top, key) {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err(ctx.bad(format!("has no {key}"))),
        };
        let (source_repo, source_revision) = (source("source_repo")?, source("source_revision")?);
        let entries = top
            .get("files")
            .and_then(Value::as_array)
            .filter(|f| !f.is_empty() && f.len() <= MAX_ENTRIES)
            .ok_or_else(|| {
                ctx.bad(format!(
                    "files must be a list of 1 to {MAX_ENTRIES} entries"
                ))
            })?;
        let prefix = match kind {
            UnitKind::Layer(n) => Some(format!("layers.{n}.")),
            _ => None,
        };
        let mut names = BTreeSet::new();
        let mut tensors = BTreeSet::new();
        let mut files = Vec::with_capacity(entries.len());
        for entry in entries {
            let file = parse_file(&ctx, entry, kind)?;
            if !names.insert(file.name().to_string()) {
                return Err(ctx.file(file.name(), "is listed twice"));
            }
            let held: Vec<&str> = match &file {
                V4File::Container(c) => c.source_tensor.iter().map(String::as_str).collect(),
                V4File::Blob { tensors, .. } => tensors.iter().map(|t| t.name.as_str()).collect(),
            };
            for name in held {
                if let Some(p) = &prefix
                    && !name.starts_with(p.as_str())
                {
                    return Err(ctx.file(file.name(), format!("holds {name}, outside {p}")));
                }
                if !tensors.insert(name.to_string()) {
                    return Err(ctx.file(file.name(), format!("holds {name} a second time")));
                }
            }
            files.push(file);
        }
        let expert_order = match (kind, top.get("expert_order")) {
            (UnitKind::Layer(_), Some(order)) => Some(permutation(&ctx, order)?),
            (UnitKind::Layer(_), None) => return Err(ctx.bad("a layer unit needs expert_order")),
            _ => None,
        };
        Ok(V4UnitManifest {
            unit: unit.to_string(),
            source_repo,
            source_revision,
            files,
            expert_order,
        })
    }

    /// The bytes of all the unit's files, saturating (the sizes are the manifest's word, and
    /// a hostile one may list sizes whose sum overflows).
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |sum, f| sum.saturating_add(f.bytes()))
    }

    /// The entry of `name`.
    pub fn file(&self, name: &str) -> Option<&V4File> {
        self.files.iter().find(|f| f.name() == name)
    }

    /// The tile that holds expert `e`.
    pub fn slot_of(&self, expert: u32) -> Option<usize> {
        self.expert_order
            .as_ref()?
            .iter()
            .position(|&x| x == expert)
    }
}

fn permutation(ctx: &Ctx, order: &Value) -> Result<Vec<u32>, V4LayoutError> {
    let list = order
        .as_array()
        .filter(|l| l.len() <= MAX_ENTRIES)
        .ok_or_else(|| ctx.bad("expert_order is not a list"))?;
    let ids: Option<Vec<u32>> = list
        .iter()
        .map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
        .collect();
    let ids = ids.ok_or_else(|| ctx.bad("expert_order holds a non-integer"))?;
    let mut seen = vec![false; ids.len()];
    for &id in &ids {
        match seen.get_mut(id as usize) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(ctx.bad(format!(
                    "expert_order is not a permutation of 0..{} ({id})",
                    ids.len()
                )));
            }
        }
    }
    Ok(ids)
}

fn parse_file(ctx: &Ctx, entry: &Value, kind: UnitKind) -> Result<V4File, V4LayoutError> {
    let m = entry
        .as_object()
        .ok_or_else(|| ctx.bad("a file entry is not an object"))?;
    let name = string(m, "name").ok_or_else(|| ctx.bad("a file entry has no name"))?;
    if name.contains('/') || check_repo_path(name).is_err() {
        return Err(ctx.file(name, "is not a plain file name"));
    }
    let bytes = unsigned(m, "bytes")
        .filter(|&b| b > 0)
        .ok_or_else(|| ctx.file(name, "has no positive bytes"))?;
    let sha256 = string(m, "sha256");
    if sha256.is_some_and(|s| !is_sha256(s)) {
        return Err(ctx.file(name, "sha256 is not 64 lowercase hex digits"));
    }
    match string(m, "kind") {
        Some("tile-container") => {
            let need =
                |key: &str| small(m, key).ok_or_else(|| ctx.file(name, format!("has no {key}")));
            let layout = string(m, "layout").unwrap_or_default();
            if !matches!(layout, "mxfp4" | "fp8-e4m3-block") {
                return Err(ctx.file(
                    name,
                    format!("layout {layout:?} is neither mxfp4 nor fp8-e4m3-block"),
                ));
            }
            let entry = ContainerEntry {
                name: name.to_string(),
                bytes,
                rows: need("rows")?,
                cols: need("cols")?,
                count: need("count")?,
                element_bits: need("element_bits")?,
                group: need("group")?,
                block_rows: small(m, "block_rows"),
                layout: layout.to_string(),
                source_tensor: string(m, "source_tensor").map(str::to_string),
                sha256: sha256.map(str::to_string),
            };
            // Each layout has one element width and group (MXFP4: 4-bit elements, a scale per
            // 32; the FP8 block: 8-bit elements, 128 columns a block); another value cannot be
            // read as either, so it is refused here rather than at the header check.
            let (bits, group) = match entry.layout.as_str() {
                "mxfp4" => (4, 32),
                _ => (8, 128),
            };
            if (entry.element_bits, entry.group) != (bits, group) {
                return Err(ctx.file(
                    name,
                    format!(
                        "says element_bits {} and group {}; layout {} is {bits}-bit elements in groups of {group}",
                        entry.element_bits, entry.group, entry.layout
                    ),
                ));
            }
            // `block_rows` may be left out; stated, a matrix's must be 128 (readers check the
            // header's either way).
            if entry.source_tensor.is_some()
                && (entry.layout != "fp8-e4m3-block"
                    || entry.count != 1
                    || entry.block_rows.is_some_and(|b| b != 128))
            {
                return Err(ctx.file(
                    name,
                    "a matrix container must be fp8-e4m3-block, one tile, block_rows 128",
                ));
            }
            if entry.source_tensor.is_none() && kind == UnitKind::Global {
                return Err(ctx.file(name, "global00 holds no expert containers"));
            }
            Ok(V4File::Container(entry))
        }
        Some("blob") => {
            let sha256 = sha256.ok_or_else(|| ctx.file(name, "a blob needs its sha256"))?;
            let tensors = blob_tensors(ctx, name, m, bytes)?;
            if kind == UnitKind::Global && tensors.iter().any(|t| t.dtype == PlainDtype::I64) {
                return Err(ctx.file(name, "global00 holds BF16 and F32 tensors only"));
            }
            Ok(V4File::Blob {
                name: name.to_string(),
                bytes,
                sha256: sha256.to_string(),
                tensors,
            })
        }
        other => Err(ctx.file(
            name,
            format!("kind {other:?} is neither tile-container nor blob"),
        )),
    }
}

/// One tensor's description: its name, dtype and shape, with its byte count checked.
fn plain_tensor(
    ctx: &Ctx,
    file: &str,
    m: &Map<String, Value>,
    offset: u64,
) -> Result<PlainTensor, V4LayoutError> {
    let name = string(m, "source_tensor")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ctx.file(file, "a tensor has no source_tensor"))?;
    let dtype = string(m, "dtype")
        .and_then(PlainDtype::parse)
        .ok_or_else(|| ctx.file(file, format!("{name}: dtype must be BF16, F32 or I64")))?;
    let shape: Option<Vec<u64>> = m
        .get("shape")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty() && s.len() <= 8)
        .and_then(|s| s.iter().map(|d| d.as_u64().filter(|&d| d > 0)).collect());
    let shape = shape
        .ok_or_else(|| ctx.file(file, format!("{name}: shape must be 1 to 8 positive dims")))?;
    let bytes = shape
        .iter()
        .try_fold(dtype.width(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| ctx.file(file, format!("{name}: its shape overflows")))?;
    Ok(PlainTensor {
        name: name.to_string(),
        dtype,
        shape,
        offset,
        bytes,
    })
}

fn blob_tensors(
    ctx: &Ctx,
    file: &str,
    m: &Map<String, Value>,
    bytes: u64,
) -> Result<Vec<PlainTensor>, V4LayoutError> {
    let Some(members) = m.get("members") else {
        let t = plain_tensor(ctx, file, m, 0)?;
        if t.bytes != bytes {
            return Err(ctx.file(
                file,
                format!("{} holds {} bytes, the file {bytes}", t.name, t.bytes),
            ));
        }
        return Ok(vec![t]);
    };
    if m.contains_key("source_tensor") {
        return Err(ctx.file(file, "a blob has members or one source_tensor, not both"));
    }
    let list = members
        .as_array()
        .filter(|l| !l.is_empty() && l.len() <= MAX_ENTRIES)
        .ok_or_else(|| {
            ctx.file(
                file,
                format!("members must be a list of 1 to {MAX_ENTRIES}"),
            )
        })?;
    let mut at = 0u64;
    let mut out = Vec::with_capacity(list.len());
    for member in list {
        let mm = member
            .as_object()
            .ok_or_else(|| ctx.file(file, "a member is not an object"))?;
        let t = plain_tensor(ctx, file, mm, at)?;
        if unsigned(mm, "offset") != Some(at) || unsigned(mm, "bytes") != Some(t.bytes) {
            return Err(ctx.file(
                file,
                format!(
                    "member {} must start at {at} and hold {} bytes (members follow each other from 0)",
                    t.name, t.bytes
                ),
            ));
        }
        at = at
            .checked_add(t.bytes)
            .ok_or_else(|| ctx.file(file, "members overflow"))?;
        out.push(t);
    }
    if at != bytes {
        return Err(ctx.file(file, format!("members hold {at} bytes, the file {bytes}")));
    }
    Ok(out)
}
