//! Writes the published DeepSeek V4 layout (`docs/formats/v4-published.md`) from a checkpoint in
//! DeepSeek's own storage: per layer `layersNN/` (and per multi-token-prediction stage `mtpNN/`)
//! a version-3 FP8 container for each FP8 matrix, three version-2 MXFP4 containers of the routed
//! experts (one expert a tile, in `expert_order`), and a plain blob of every other tensor;
//! `global00/` the embedding and head as standalone blobs and a plain blob of the rest. Every
//! byte is the checkpoint's: the containers hold the stored codes and scales unchanged (the FP8
//! scale region padded to its 16 KiB page, as the mode defines), the blobs the tensors' bytes
//! back to back.
//!
//! What the sources leave open and this writer chooses: container file names from the tensor
//! name (`layers.0.attn.wq_a.weight` -> `layers00-attn_wq_a_weight.fp8tile`; readers go by
//! `source_tensor`), files and blob members in name order, experts in the text order of their
//! numbers (0, 1, 10, 100, ...), recorded in `expert_order`.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use minirun_format::artifact::INCOMPLETE_MARKER;
use minirun_format::artifact::k3_published::slot_order;
use minirun_format::tile::{
    ContainerWriter, ContentKind, Geometry, MXFP4_GROUP, QuantMode, ScaleDtype,
};
use safetensors::tensor::Dtype;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::PackError;
use crate::checkpoint::Checkpoint;
use crate::pack::{PackOptions, check_provenance, copy_verbatim, prepare_output};
use crate::shard::{TensorSource, read_slice_into};

/// The FP8 block the published containers hold (V4 Flash's `weight_block_size`).
const FP8_BLOCK: u32 = 128;
/// The expert projections, container by container.
const EXPERT_PROJECTIONS: [&str; 3] = ["w1", "w3", "w2"];

/// What a write did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct V4Summary {
    pub units: usize,
    pub payload_files: usize,
    pub payload_bytes: u64,
    pub copied_files: Vec<String>,
}

fn refused(what: impl Into<String>, reason: impl Into<String>) -> PackError {
    PackError::Refused {
        what: what.into(),
        reason: reason.into(),
    }
}

/// Where a tensor goes.
enum Unit {
    Layer(usize),
    Mtp(usize),
    Global,
}

impl Unit {
    fn of(name: &str) -> Result<(Unit, &str), PackError> {
        let numbered = |rest: &str| -> Option<(usize, usize)> {
            let (n, _) = rest.split_once('.')?;
            Some((n.parse().ok()?, n.len() + 1))
        };
        if let Some(rest) = name.strip_prefix("layers.") {
            let (n, skip) = numbered(rest).ok_or_else(|| refused(name, "has no layer number"))?;
            return Ok((Unit::Layer(n), &rest[skip..]));
        }
        if let Some(rest) = name.strip_prefix("mtp.") {
            let (n, skip) = numbered(rest).ok_or_else(|| refused(name, "has no stage number"))?;
            return Ok((Unit::Mtp(n), &rest[skip..]));
        }
        Ok((Unit::Global, name))
    }

    fn dir(&self) -> String {
        match self {
            Unit::Layer(n) => format!("layers{n:02}"),
            Unit::Mtp(n) => format!("mtp{n:02}"),
            Unit::Global => "global00".into(),
        }
    }
}

/// One unit's tensors by kind.
#[derive(Default)]
struct UnitPlan<'c> {
    fp8: Vec<(&'c TensorSource, &'c TensorSource)>,
    /// `[projection][expert]` codes and scales.
    experts: BTreeMap<usize, [Option<(&'c TensorSource, &'c TensorSource)>; 3]>,
    plain: Vec<&'c TensorSource>,
}

fn plain_dtype(t: &TensorSource) -> Result<&'static str, PackError> {
    match t.dtype {
        Dtype::BF16 => Ok("BF16"),
        Dtype::F32 => Ok("F32"),
        Dtype::I64 => Ok("I64"),
        other => Err(refused(
            &t.name,
            format!("is {other:?}; the published layout's plain tensors are BF16, F32 or I64"),
        )),
    }
}

/// Sorts every tensor into its unit and kind, refusing what the layout cannot hold.
fn plan(ckpt: &Checkpoint) -> Result<BTreeMap<String, UnitPlan<'_>>, PackError> {
    let mut units: BTreeMap<String, UnitPlan> = BTreeMap::new();
    for t in ckpt.tensors.values() {
        let (unit, rest) = Unit::of(&t.name)?;
        let entry = units.entry(unit.dir()).or_default();
        let scale_of = |t: &TensorSource| -> Result<&TensorSource, PackError> {
            let module = t.name.strip_suffix(".weight").unwrap_or(&t.name);
            ckpt.tensors
                .get(&format!("{module}.scale"))
                .ok_or_else(|| refused(&t.name, format!("has no {module}.scale")))
        };
        match t.dtype {
            // Taken with the FP8 or FP4 tensor it scales; one that scales nothing is refused
            // rather than dropped.
            Dtype::F8_E8M0 if t.name.ends_with(".scale") => {
                let owner = format!("{}.weight", t.name.trim_end_matches(".scale"));
                let quantized = ckpt
                    .tensors
                    .get(&owner)
                    .is_some_and(|o| matches!(o.dtype, Dtype::F8_E4M3 | Dtype::I8));
                if !quantized {
                    return Err(refused(
                        &t.name,
                        format!("scales no FP8 or FP4 tensor ({owner} is absent or plain)"),
                    ));
                }
            }
            Dtype::F8_E4M3 => entry.fp8.push((t, scale_of(t)?)),
            Dtype::I8 => {
                let (e, k) = expert_of(rest).ok_or_else(|| {
                    refused(
                        &t.name,
                        "is FP4 but not a routed expert's ffn.experts.E.w1/w3/w2",
                    )
                })?;
                entry.experts.entry(e).or_default()[k] = Some((t, scale_of(t)?));
            }
            _ => {
                plain_dtype(t)?;
                entry.plain.push(t);
            }
        }
    }
    Ok(units)
}

/// `ffn.experts.E.wK.weight` -> (E, projection index).
fn expert_of(rest: &str) -> Option<(usize, usize)> {
    let rest = rest.strip_prefix("ffn.experts.")?;
    let (e, rest) = rest.split_once('.')?;
    let (w, suffix) = rest.split_once('.')?;
    (suffix == "weight").then_some(())?;
    Some((
        e.parse().ok()?,
        EXPERT_PROJECTIONS.iter().position(|p| *p == w)?,
    ))
}

fn bytes_of(ckpt: &Checkpoint, t: &TensorSource) -> Result<Vec<u8>, PackError> {
    let mut buf = Vec::new();
    read_slice_into(&ckpt.dir, t, 0, t.len, &mut buf)?;
    Ok(buf)
}

/// Writes the published layout of the checkpoint at `source` into `out`. The layout names
/// the upstream in every manifest, so `opts` must give it.
pub fn pack_v4_published(
    source: &Path,
    out: &Path,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<V4Summary, PackError> {
    check_provenance(opts)?;
    let (Some(repo), Some(revision)) = (&opts.source_repo, &opts.source_revision) else {
        return Err(refused(
            "--source-repo",
            "the published DeepSeek V4 layout names its upstream in every manifest: give --source-repo and --source-revision",
        ));
    };
    let ckpt = Checkpoint::open(source)?;
    let units = plan(&ckpt)?;
    for (unit, p) in &units {
        check_unit(unit, p)?;
    }
    prepare_output(out, &ckpt.other_files)?;
    let mut index_units = Vec::new();
    let (mut files, mut total) = (0, 0u64);
    // The published order: the layers, then the MTP stages, then global00.
    let mut order: Vec<&String> = units.keys().filter(|u| u.starts_with("layers")).collect();
    order.extend(units.keys().filter(|u| u.starts_with("mtp")));
    order.extend(units.keys().filter(|u| *u == "global00"));
    for unit in order {
        let (n, bytes) = write_unit(&ckpt, out, unit, &units[unit], repo, revision, progress)?;
        index_units.push(json!({"unit": unit, "files": n, "bytes": bytes}));
        files += n;
        total += bytes;
    }
    for name in &ckpt.other_files {
        copy_verbatim(&ckpt.dir.join(name), &out.join(name))?;
    }
    let index = json!({
        "source_repo": repo,
        "source_revision": revision,
        "relationship": "byte-preserving repack",
        "units": index_units,
        "total_bytes": total,
    });
    atomic_file::write_bytes(&out.join("index.json"), format!("{index:#}\n").as_bytes())?;
    std::fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
    atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
    Ok(V4Summary {
        units: index_units.len(),
        payload_files: files,
        payload_bytes: total,
        copied_files: ckpt.other_files.clone(),
    })
}

/// What the layout requires of a unit, checked before anything is written.
fn check_unit(unit: &str, p: &UnitPlan) -> Result<(), PackError> {
    if unit == "global00" {
        if !p.fp8.is_empty() || !p.experts.is_empty() {
            return Err(refused(
                unit,
                "global tensors are plain in the published layout",
            ));
        }
        for name in ["embed.weight", "head.weight"] {
            let t = p.plain.iter().find(|t| t.name == name);
            if t.is_none_or(|t| t.dtype != Dtype::BF16 || t.shape.len() != 2) {
                return Err(refused(name, "must be a BF16 [vocab, hidden] tensor"));
            }
        }
        return Ok(());
    }
    for (weight, scale) in &p.fp8 {
        let [rows, cols] = weight.shape[..] else {
            return Err(refused(&weight.name, "is not a matrix"));
        };
        let grid = [rows.div_ceil(128), cols.div_ceil(128)];
        if scale.shape != grid || !rows.is_multiple_of(128) || !cols.is_multiple_of(128) {
            return Err(refused(
                &weight.name,
                format!(
                    "is {rows} x {cols} with scales {:?}: a published FP8 container holds whole 128 x 128 blocks",
                    scale.shape
                ),
            ));
        }
    }
    let count = p.experts.len();
    for (e, projections) in &p.experts {
        if *e >= count || projections.iter().any(Option::is_none) {
            return Err(refused(
                unit,
                format!(
                    "expert {e} lacks a projection, or the experts are not numbered 0..{count}"
                ),
            ));
        }
    }
    Ok(())
}

fn write_unit(
    ckpt: &Checkpoint,
    out: &Path,
    unit: &str,
    p: &UnitPlan,
    repo: &str,
    revision: &str,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(usize, u64), PackError> {
    let dir = out.join(unit);
    std::fs::create_dir_all(&dir).map_err(|e| PackError::io(&dir, e))?;
    let mut files = Vec::new();
    for (weight, scale) in &p.fp8 {
        files.push(write_fp8(ckpt, &dir, unit, weight, scale)?);
        progress(weight.len + scale.len);
    }
    let mut manifest = json!({"unit": unit, "source_repo": repo, "source_revision": revision});
    if !p.experts.is_empty() {
        let order = slot_order(p.experts.len());
        for k in 0..3 {
            files.push(write_experts(ckpt, &dir, unit, p, &order, k, progress)?);
        }
        manifest["expert_order"] = order.iter().map(|&e| e as u64).collect::<Vec<_>>().into();
    }
    match unit {
        "global00" => {
            for name in ["embed.weight", "head.weight"] {
                let t = p.plain.iter().find(|t| t.name == name).copied();
                let t = t.ok_or_else(|| refused(name, "is missing"))?;
                let file = format!("{unit}-{}.bin", name.replace('.', "_"));
                files.push(write_blob(ckpt, &dir, &file, &[t], false)?);
                progress(t.len);
            }
            let rest: Vec<&TensorSource> = p
                .plain
                .iter()
                .copied()
                .filter(|t| t.name != "embed.weight" && t.name != "head.weight")
                .collect();
            if !rest.is_empty() {
                files.push(write_blob(
                    ckpt,
                    &dir,
                    &format!("{unit}-plain.bin"),
                    &rest,
                    true,
                )?);
            }
        }
        _ if !p.plain.is_empty() => {
            files.push(write_blob(
                ckpt,
                &dir,
                &format!("{unit}-plain.bin"),
                &p.plain,
                true,
            )?);
        }
        _ => {}
    }
    let bytes = files.iter().filter_map(|f| f["bytes"].as_u64()).sum();
    let count = files.len();
    manifest["files"] = Value::Array(files);
    atomic_file::write_bytes(
        &dir.join("manifest.json"),
        format!("{manifest:#}\n").as_bytes(),
    )?;
    Ok((count, bytes))
}

fn write_fp8(
    ckpt: &Checkpoint,
    dir: &Path,
    unit: &str,
    weight: &TensorSource,
    scale: &TensorSource,
) -> Result<Value, PackError> {
    let dim = |d: usize| {
        u32::try_from(d).map_err(|_| {
            refused(
                &weight.name,
                format!("dimension {d} does not fit a container"),
            )
        })
    };
    let (rows, cols) = (dim(weight.shape[0])?, dim(weight.shape[1])?);
    let (_, rest) = Unit::of(&weight.name)?;
    let name = format!("{unit}-{}.fp8tile", rest.replace('.', "_"));
    let geometry = Geometry {
        mode: QuantMode::Fp8E4m3Block,
        rows,
        cols,
        group_size: FP8_BLOCK,
        bits: 8,
        scale_dtype: ScaleDtype::E8m0,
        scale_block_rows: FP8_BLOCK,
        tile_count: 1,
    };
    let (codes, scales) = (bytes_of(ckpt, weight)?, bytes_of(ckpt, scale)?);
    let bytes = write_container(dir, &name, geometry, |w| w.push_tile(&codes, &scales, &[]))?;
    Ok(json!({
        "name": name, "kind": "tile-container", "bytes": bytes, "layout": "fp8-e4m3-block",
        "rows": rows, "cols": cols, "count": 1, "element_bits": 8, "group": FP8_BLOCK,
        "block_rows": FP8_BLOCK, "source_tensor": weight.name,
    }))
}

/// One projection's expert container: tile i holds expert `order[i]`.
fn write_experts(
    ckpt: &Checkpoint,
    dir: &Path,
    unit: &str,
    p: &UnitPlan,
    order: &[usize],
    k: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Value, PackError> {
    let first = p.experts[&0][k].ok_or_else(|| refused(unit, "expert 0 is missing"))?;
    let (codes, _) = first;
    let fits = |d: usize| u32::try_from(d).ok();
    let (rows, cols) = match codes.shape[..] {
        [r, half] => match (fits(r), half.checked_mul(2).and_then(fits)) {
            (Some(r), Some(c)) => (r, c),
            _ => {
                return Err(refused(
                    &codes.name,
                    "has dimensions that do not fit a container",
                ));
            }
        },
        _ => return Err(refused(&codes.name, "is not a matrix")),
    };
    let name = format!("{unit}-{}.mxfp4tile", EXPERT_PROJECTIONS[k]);
    let geometry = Geometry {
        mode: QuantMode::Mxfp4,
        rows,
        cols,
        group_size: MXFP4_GROUP,
        bits: 4,
        scale_dtype: ScaleDtype::E8m0,
        scale_block_rows: 1,
        tile_count: order.len() as u32,
    };
    let bytes = write_container(dir, &name, geometry, |w| {
        for &e in order {
            let (codes, scales) = p.experts[&e][k].ok_or_else(|| {
                minirun_format::tile::WriteError::Io(std::io::Error::other(format!(
                    "expert {e} lacks {}",
                    EXPERT_PROJECTIONS[k]
                )))
            })?;
            let read = |t| {
                bytes_of(ckpt, t).map_err(|e| {
                    minirun_format::tile::WriteError::Io(std::io::Error::other(e.to_string()))
                })
            };
            let (c, s) = (read(codes)?, read(scales)?);
            w.push_tile(&c, &s, &[])?;
            progress(codes.len + scales.len);
        }
        Ok(())
    })?;
    Ok(json!({
        "name": name, "kind": "tile-container", "bytes": bytes, "layout": "mxfp4",
        "rows": rows, "cols": cols, "count": order.len(), "element_bits": 4, "group": MXFP4_GROUP,
    }))
}

type Writer = ContainerWriter<BufWriter<std::fs::File>>;

/// Writes a checkpoint-derived container with a digest per tile.
fn write_container(
    dir: &Path,
    name: &str,
    geometry: Geometry,
    fill: impl FnOnce(&mut Writer) -> Result<(), minirun_format::tile::WriteError>,
) -> Result<u64, PackError> {
    let mut bytes = 0;
    atomic_file::write_with(&dir.join(name), atomic_file::Options::default(), |file| {
        let buffered = BufWriter::with_capacity(
            4 << 20,
            file.try_clone().map_err(|e| PackError::io(name, e))?,
        );
        let mut writer =
            ContainerWriter::new(buffered, geometry, ContentKind::CheckpointDerived, 0, true)
                .map_err(|e| refused(name, e.to_string()))?;
        fill(&mut writer).map_err(|e| refused(name, e.to_string()))?;
        let (mut buffered, container) =
            writer.finish().map_err(|e| refused(name, e.to_string()))?;
        buffered.flush().map_err(|e| PackError::io(name, e))?;
        bytes = container.layout.total_bytes;
        Ok::<(), PackError>(())
    })?;
    Ok(bytes)
}

/// A plain blob: the tensors' bytes back to back, as members (or one standalone tensor).
fn write_blob(
    ckpt: &Checkpoint,
    dir: &Path,
    name: &str,
    tensors: &[&TensorSource],
    members: bool,
) -> Result<Value, PackError> {
    let mut data = Vec::new();
    let mut listed = Vec::new();
    for t in tensors {
        let offset = data.len();
        data.extend(bytes_of(ckpt, t)?);
        listed.push(json!({
            "source_tensor": t.name, "dtype": plain_dtype(t)?, "shape": t.shape,
            "offset": offset, "bytes": t.len,
        }));
    }
    atomic_file::write_bytes(&dir.join(name), &data)?;
    let sha256 = minirun_format::tile::hex(&Sha256::digest(&data));
    let mut entry = json!({"name": name, "kind": "blob", "bytes": data.len(), "sha256": sha256});
    match (members, tensors) {
        (false, [t]) => {
            entry["source_tensor"] = t.name.clone().into();
            entry["dtype"] = plain_dtype(t)?.into();
            entry["shape"] = t.shape.clone().into();
        }
        _ => entry["members"] = Value::Array(listed),
    }
    Ok(entry)
}
