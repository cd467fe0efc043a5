//! The published Kimi K3 artifact's own layout (`nanguoyu/Kimi-K3-minirun`), which is not the
//! layout `minirun pack` writes: per layer, `layerNN/manifest.json` with a row-band table of the
//! deterministic blob `layerNN-deterministic.bin`, and three version-1 expert containers
//! `layerNN-w1/w3/w2.mxfp4tile` whose tiles are row bands of experts in a permuted slot order;
//! `global/` holds the embedding, the LM head and `final.bin` by geometry alone.
//!
//! Pure rules: parse and check the manifests, group the row bands into tensors, recover the
//! expert geometry from the three container headers, and say where each expert's bands are.
//! Spec: `docs/formats/k3-published.md`.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;

use super::is_member_file_name;
use crate::tile::{ALIGNMENT, HEADER_BYTES, RawHeader};

/// A layer's deterministic units are at most this many: far above K3's (a few hundred), and a
/// bound on what a hostile manifest makes a reader hold.
pub const MAX_UNITS: usize = 1 << 20;

/// The expert containers of a layer, by projection.
pub const EXPERT_PROJECTIONS: [&str; 3] = ["w1", "w3", "w2"];

/// `final.bin`'s vectors, in file order, each in its own 16 KiB unit.
pub const FINAL_TENSORS: [&str; 3] = ["norm", "output_attn_res_norm", "output_attn_res_proj"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum K3LayoutError {
    #[error("{path}: {reason}")]
    Manifest { path: String, reason: String },
    #[error("{path}: unit {index} ({tensor}): {reason}")]
    Unit {
        path: String,
        index: usize,
        tensor: String,
        reason: String,
    },
    #[error("{path}: tensor {tensor}: {reason}")]
    Tensor {
        path: String,
        tensor: String,
        reason: String,
    },
    #[error("layer {layer}'s expert containers: {reason}")]
    Experts { layer: usize, reason: String },
    #[error("global/{file}: {reason}")]
    Global { file: String, reason: String },
}

/// A band's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BandDtype {
    F32,
    Bf16,
}

impl BandDtype {
    pub fn width(self) -> u64 {
        match self {
            BandDtype::F32 => 4,
            BandDtype::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BandDtype::F32 => "F32",
            BandDtype::Bf16 => "BF16",
        }
    }
}

/// One row band of one tensor in the deterministic blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeterministicUnit {
    pub index: usize,
    pub tensor: String,
    pub role: String,
    pub dtype: BandDtype,
    pub row_start: u64,
    pub rows: u64,
    pub cols: u64,
    /// Where the band starts in the blob (a multiple of 16 KiB), the bytes it occupies there
    /// (a multiple of 16 KiB), and the real bytes at its start (`rows · cols · width`).
    pub offset: u64,
    pub length: u64,
    pub payload_length: u64,
}

/// A layer manifest's deterministic blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deterministic {
    pub file: String,
    /// The blob's declared length: the sum of the units' lengths.
    pub bytes: u64,
    pub units: Vec<DeterministicUnit>,
}

/// `layerNN/manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K3LayerManifest {
    pub layer: usize,
    pub nonexpert: Deterministic,
}

/// One tensor of the deterministic blob, its bands in row order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BandedTensor {
    pub name: String,
    pub role: String,
    pub dtype: BandDtype,
    pub rows: u64,
    pub cols: u64,
    /// `(offset, payload_length)` in the blob, band by band from row 0.
    pub bands: Vec<(u64, u64)>,
}

impl BandedTensor {
    /// The tensor's bytes: its bands' payloads joined.
    pub fn bytes(&self) -> u64 {
        self.bands.iter().map(|(_, len)| len).sum()
    }
}

#[derive(Deserialize)]
struct RawManifest {
    layer: Option<serde_json::Value>,
    nonexpert: Option<RawNonexpert>,
}

#[derive(Deserialize)]
struct RawNonexpert {
    file: Option<String>,
    bytes: Option<serde_json::Value>,
    units: Option<Vec<serde_json::Value>>,
    /// Redundant totals some manifests carry; checked when present.
    unit_count: Option<serde_json::Value>,
    bytes_by_role: Option<BTreeMap<String, serde_json::Value>>,
}

fn unsigned(v: &serde_json::Value) -> Option<u64> {
    v.as_u64()
}

impl K3LayerManifest {
    /// Parses and checks `layerNN/manifest.json` (shown as `path`) of directory number
    /// `layer`. Keys outside the ones read are the publisher's bookkeeping and are ignored
    /// (the `dense` flag among them: it is written on every layer, MoE or not).
    pub fn parse(bytes: &[u8], path: &str, layer: usize) -> Result<K3LayerManifest, K3LayoutError> {
        let bad = |reason: String| K3LayoutError::Manifest {
            path: path.to_string(),
            reason,
        };
        let raw: RawManifest = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not JSON of a K3 layer manifest ({e})")))?;
        let named = raw
            .layer
            .as_ref()
            .and_then(unsigned)
            .ok_or_else(|| bad("`layer` is missing or not a non-negative integer".into()))?;
        if named != layer as u64 {
            return Err(bad(format!(
                "names layer {named}, but it is layer {layer}'s"
            )));
        }
        let nonexpert = raw
            .nonexpert
            .ok_or_else(|| bad("`nonexpert` is missing".into()))?;
        let file = nonexpert
            .file
            .ok_or_else(|| bad("`nonexpert.file` is missing".into()))?;
        if !is_member_file_name(&file) || file.starts_with('.') {
            return Err(bad(format!(
                "`nonexpert.file` {file:?} is not a plain file name inside the layer's directory"
            )));
        }
        let declared = nonexpert.bytes.as_ref().and_then(unsigned).ok_or_else(|| {
            bad("`nonexpert.bytes` is missing or not a non-negative integer".into())
        })?;
        let raw_units = nonexpert
            .units
            .ok_or_else(|| bad("`nonexpert.units` is missing".into()))?;
        if raw_units.len() > MAX_UNITS {
            return Err(bad(format!("more than {MAX_UNITS} units")));
        }
        let mut units = raw_units
            .iter()
            .enumerate()
            .map(|(n, u)| parse_unit(u, path, n))
            .collect::<Result<Vec<_>, _>>()?;
        units.sort_by_key(|u| u.index);
        if let Some(u) = units.iter().enumerate().find(|(i, u)| u.index != *i) {
            return Err(bad(format!(
                "unit indexes are not 0..{}: {} is missing or repeated",
                units.len(),
                u.0
            )));
        }
        let manifest = K3LayerManifest {
            layer,
            nonexpert: Deterministic {
                file,
                bytes: declared,
                units,
            },
        };
        manifest.check_extents(path)?;
        if let Some(count) = nonexpert.unit_count
            && unsigned(&count) != Some(manifest.nonexpert.units.len() as u64)
        {
            return Err(bad(format!(
                "`nonexpert.unit_count` is {count}, and it lists {} units",
                manifest.nonexpert.units.len()
            )));
        }
        if let Some(by_role) = nonexpert.bytes_by_role {
            manifest.check_roles(path, &by_role)?;
        }
        manifest.tensors(path)?;
        Ok(manifest)
    }

    /// Units on 16 KiB boundaries, inside the declared length, not overlapping, their lengths
    /// summing to it.
    fn check_extents(&self, path: &str) -> Result<(), K3LayoutError> {
        let d = &self.nonexpert;
        let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(d.units.len());
        let mut total = 0u64;
        for u in &d.units {
            let end = u.offset.checked_add(u.length);
            if end.is_none_or(|end| end > d.bytes) {
                return Err(unit_err(
                    path,
                    u,
                    format!(
                        "bytes {}..{} run past the blob's {}",
                        u.offset,
                        u.offset.saturating_add(u.length),
                        d.bytes
                    ),
                ));
            }
            total = total.saturating_add(u.length);
            spans.push((u.offset, u.offset + u.length, u.index));
        }
        spans.sort();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(K3LayoutError::Manifest {
                path: path.to_string(),
                reason: format!("units {} and {} overlap", w[0].2, w[1].2),
            });
        }
        if total != d.bytes {
            return Err(K3LayoutError::Manifest {
                path: path.to_string(),
                reason: format!(
                    "its units occupy {total} bytes; `nonexpert.bytes` says {}",
                    d.bytes
                ),
            });
        }
        Ok(())
    }

    fn check_roles(
        &self,
        path: &str,
        by_role: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), K3LayoutError> {
        let mut derived: BTreeMap<&str, u64> = BTreeMap::new();
        for u in &self.nonexpert.units {
            *derived.entry(u.role.as_str()).or_default() += u.length;
        }
        let stated: Option<BTreeMap<&str, u64>> = by_role
            .iter()
            .map(|(k, v)| Some((k.as_str(), unsigned(v)?)))
            .collect();
        if stated.as_ref() != Some(&derived) {
            return Err(K3LayoutError::Manifest {
                path: path.to_string(),
                reason: format!("`nonexpert.bytes_by_role` does not match its units ({derived:?})"),
            });
        }
        Ok(())
    }

    /// The blob's tensors by name, each one's bands in row order: every band of a tensor has
    /// its columns and element type, and the bands cover rows `0..rows` with no gap.
    pub fn tensors(&self, path: &str) -> Result<BTreeMap<String, BandedTensor>, K3LayoutError> {
        let mut grouped: BTreeMap<&str, Vec<&DeterministicUnit>> = BTreeMap::new();
        for u in &self.nonexpert.units {
            grouped.entry(u.tensor.as_str()).or_default().push(u);
        }
        let mut tensors = BTreeMap::new();
        for (name, mut bands) in grouped {
            bands.sort_by_key(|u| u.row_start);
            let first = bands[0];
            let err = |reason: String| K3LayoutError::Tensor {
                path: path.to_string(),
                tensor: name.to_string(),
                reason,
            };
            let mut next_row = 0u64;
            for b in &bands {
                if b.cols != first.cols || b.dtype != first.dtype || b.role != first.role {
                    return Err(err(format!(
                        "unit {} is {} x {} {} ({}), unit {} {} x {} {} ({})",
                        first.index,
                        first.rows,
                        first.cols,
                        first.dtype.name(),
                        first.role,
                        b.index,
                        b.rows,
                        b.cols,
                        b.dtype.name(),
                        b.role
                    )));
                }
                if b.row_start != next_row {
                    return Err(err(format!(
                        "its bands cover rows up to {next_row}, and unit {} starts at row {}",
                        b.index, b.row_start
                    )));
                }
                next_row = next_row.saturating_add(b.rows);
            }
            tensors.insert(
                name.to_string(),
                BandedTensor {
                    name: name.to_string(),
                    role: first.role.clone(),
                    dtype: first.dtype,
                    rows: next_row,
                    cols: first.cols,
                    bands: bands.iter().map(|b| (b.offset, b.payload_length)).collect(),
                },
            );
        }
        Ok(tensors)
    }
}

fn unit_err(path: &str, u: &DeterministicUnit, reason: String) -> K3LayoutError {
    K3LayoutError::Unit {
        path: path.to_string(),
        index: u.index,
        tensor: u.tensor.clone(),
        reason,
    }
}

fn parse_unit(
    v: &serde_json::Value,
    path: &str,
    n: usize,
) -> Result<DeterministicUnit, K3LayoutError> {
    let at = |reason: String| K3LayoutError::Manifest {
        path: path.to_string(),
        reason: format!("`nonexpert.units[{n}]`: {reason}"),
    };
    let int = |key: &str| -> Result<u64, K3LayoutError> {
        v.get(key)
            .and_then(unsigned)
            .ok_or_else(|| at(format!("`{key}` is missing or not a non-negative integer")))
    };
    let text = |key: &str| -> Result<String, K3LayoutError> {
        v.get(key)
            .and_then(|s| s.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| at(format!("`{key}` is missing or empty")))
    };
    let dtype = match text("dtype")?.as_str() {
        "F32" => BandDtype::F32,
        "BF16" => BandDtype::Bf16,
        other => return Err(at(format!("dtype {other:?} is neither F32 nor BF16"))),
    };
    let unit = DeterministicUnit {
        index: usize::try_from(int("index")?).map_err(|_| at("`index` is too large".into()))?,
        tensor: text("tensor")?,
        role: text("role")?,
        dtype,
        row_start: int("row_start")?,
        rows: int("rows")?,
        cols: int("cols")?,
        offset: int("offset")?,
        length: int("length")?,
        payload_length: int("payload_length")?,
    };
    let payload = unit
        .rows
        .checked_mul(unit.cols)
        .and_then(|n| n.checked_mul(dtype.width()));
    let reason = if unit.rows == 0 || unit.cols == 0 {
        Some("a band of no rows or no columns".to_string())
    } else if !unit.offset.is_multiple_of(ALIGNMENT)
        || !unit.length.is_multiple_of(ALIGNMENT)
        || unit.length == 0
    {
        Some(format!(
            "offset {} and length {} must be positive multiples of {ALIGNMENT}",
            unit.offset, unit.length
        ))
    } else if payload != Some(unit.payload_length) {
        Some(format!(
            "payload_length {} is not rows x cols x {} = {}",
            unit.payload_length,
            dtype.width(),
            payload.map_or("too many".to_string(), |p| p.to_string())
        ))
    } else if unit.payload_length > unit.length {
        Some(format!(
            "payload_length {} exceeds its length {}",
            unit.payload_length, unit.length
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(unit_err(path, &unit, reason)),
        None => Ok(unit),
    }
}

/// Slot `s` of an expert container holds expert `slot_order(n)[s]`: the checkpoint's order,
/// experts sorted by their numbers as decimal text (0, 1, 10, 100, 101, ...).
pub fn slot_order(experts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..experts).collect();
    order.sort_by_key(|e| e.to_string());
    order
}

/// A layer's routed experts, as its three version-1 containers store them: tile `slot · bands
/// + band` is band `band` (output rows `band · rows ..`) of the expert in slot `slot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K3Experts {
    pub experts: usize,
    /// The latent width the experts read (w1 and w3 columns, w2 rows) and their inner width.
    pub latent: usize,
    pub intermediate: usize,
    /// Bands per expert of w1/w3 and of w2.
    pub gate_up_bands: usize,
    pub down_bands: usize,
    /// Each expert's slot.
    slot_of: Vec<usize>,
}

impl K3Experts {
    /// The geometry the three headers (w1, w3, w2) imply, checked: w1 and w3 alike, both band
    /// counts exact, one expert count.
    pub fn from_headers(
        layer: usize,
        w1: &RawHeader,
        w3: &RawHeader,
        w2: &RawHeader,
    ) -> Result<K3Experts, K3LayoutError> {
        let bad = |reason: String| K3LayoutError::Experts { layer, reason };
        if (w1.rows, w1.cols, w1.tile_count, w1.tile_stride)
            != (w3.rows, w3.cols, w3.tile_count, w3.tile_stride)
        {
            return Err(bad(format!(
                "w1 is {} x {} in {} tiles, w3 {} x {} in {}",
                w1.rows, w1.cols, w1.tile_count, w3.rows, w3.cols, w3.tile_count
            )));
        }
        let (latent, intermediate) = (w1.cols as usize, w2.cols as usize);
        let bands = |out: usize, rows: u32, what: &str| -> Result<usize, K3LayoutError> {
            match rows {
                0 => Err(bad(format!("{what} has bands of 0 rows"))),
                r if out.is_multiple_of(r as usize) && out > 0 => Ok(out / r as usize),
                r => Err(bad(format!(
                    "{what}'s {out} output rows are not whole bands of {r}"
                ))),
            }
        };
        let gate_up_bands = bands(intermediate, w1.rows, "w1")?;
        let down_bands = bands(latent, w2.rows, "w2")?;
        let count = |tiles: u32, bands: usize, what: &str| -> Result<usize, K3LayoutError> {
            match (tiles as usize).is_multiple_of(bands) {
                true => Ok(tiles as usize / bands),
                false => Err(bad(format!(
                    "{what}'s {tiles} tiles are not whole experts of {bands} bands"
                ))),
            }
        };
        let experts = count(w1.tile_count, gate_up_bands, "w1")?;
        if count(w2.tile_count, down_bands, "w2")? != experts || experts == 0 {
            return Err(bad(format!(
                "w1 holds {experts} experts and w2 {}",
                w2.tile_count as usize / down_bands
            )));
        }
        let mut slot_of = vec![0; experts];
        for (slot, e) in slot_order(experts).into_iter().enumerate() {
            slot_of[e] = slot;
        }
        Ok(K3Experts {
            experts,
            latent,
            intermediate,
            gate_up_bands,
            down_bands,
            slot_of,
        })
    }

    /// The tiles of expert `expert` in a projection's container (`w1`, `w3` or `w2`).
    pub fn tiles(&self, projection: &str, expert: usize) -> Option<Range<u64>> {
        let bands = match projection {
            "w1" | "w3" => self.gate_up_bands,
            "w2" => self.down_bands,
            _ => return None,
        } as u64;
        let slot = *self.slot_of.get(expert)? as u64;
        Some(slot * bands..(slot + 1) * bands)
    }

    /// The bytes of expert `expert` in a container whose tiles are `stride` apart: its bands
    /// are consecutive tiles, one read.
    pub fn byte_range(&self, projection: &str, expert: usize, stride: u64) -> Option<Range<u64>> {
        let tiles = self.tiles(projection, expert)?;
        Some(HEADER_BYTES + tiles.start * stride..HEADER_BYTES + tiles.end * stride)
    }
}

/// Checks `global/`'s three files by length: the embedding and the LM head are dense BF16
/// `[vocab, hidden]`, `final.bin` is [`FINAL_TENSORS`] as BF16 `[hidden]` vectors, each in a
/// 16 KiB unit. Returns the offset of each of `final.bin`'s vectors.
pub fn check_globals(
    vocab: u64,
    hidden: u64,
    embed_bytes: u64,
    lm_head_bytes: u64,
    final_bytes: u64,
) -> Result<[u64; 3], K3LayoutError> {
    let dense = vocab.checked_mul(hidden).and_then(|n| n.checked_mul(2));
    for (file, len) in [
        ("embed_tokens.bin", embed_bytes),
        ("lm_head.bin", lm_head_bytes),
    ] {
        if dense != Some(len) {
            return Err(K3LayoutError::Global {
                file: file.to_string(),
                reason: format!("{len} bytes, not {vocab} x {hidden} BF16"),
            });
        }
    }
    if hidden.saturating_mul(2) > ALIGNMENT || final_bytes != 3 * ALIGNMENT {
        return Err(K3LayoutError::Global {
            file: "final.bin".into(),
            reason: format!(
                "{final_bytes} bytes, not three 16 KiB units each holding {hidden} BF16 values"
            ),
        });
    }
    Ok([0, ALIGNMENT, 2 * ALIGNMENT])
}
