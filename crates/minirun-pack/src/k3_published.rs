//! Writes the published Kimi K3 layout (`docs/formats/k3-published.md`) from a K3 checkpoint
//! stored under the upstream tensor names, with its routed experts in MLX MXFP4 (per-expert
//! `block_sparse_moe.experts.E.w1/w3/w2` `weight` and `scales`) and every other tensor F32 or
//! BF16: `global/` (embedding, LM head, `final.bin`), and per layer the row-banded
//! deterministic blob with its manifest and the three banded expert containers, experts in the
//! text order of their numbers. Every byte is copied from the checkpoint unchanged.
//!
//! The band heights are this writer's choice (the layout's readers depend only on the band
//! table and the container headers): a deterministic tensor's bands are as many rows as fit in
//! `band_bytes`, an expert's as `expert_band_rows` says.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use minirun_format::artifact::INCOMPLETE_MARKER;
use minirun_format::artifact::k3_published::{FINAL_TENSORS, slot_order};
use minirun_format::tile::{
    ALIGNMENT, ContainerWriter, ContentKind, Geometry, MXFP4_GROUP, QuantMode, ScaleDtype,
};
use safetensors::tensor::Dtype;
use serde_json::{Value, json};

use crate::PackError;
use crate::checkpoint::Checkpoint;
use crate::pack::{copy_verbatim, prepare_output};
use crate::shard::{TensorSource, read_slice_into};

/// Band heights.
#[derive(Debug, Clone, Copy)]
pub struct BandSizes {
    /// The most bytes of one deterministic band (at least one row).
    pub band_bytes: u64,
    /// Rows per band of w1/w3 and of w2.
    pub expert_band_rows: (usize, usize),
}

impl Default for BandSizes {
    /// Kimi K3's own: 256 rows of a 7,168-wide BF16 tensor; experts in bands of 1,024 and 512.
    fn default() -> Self {
        BandSizes {
            band_bytes: 256 * 7168 * 2,
            expert_band_rows: (1024, 512),
        }
    }
}

fn refused(what: impl Into<String>, reason: impl Into<String>) -> PackError {
    PackError::Refused {
        what: what.into(),
        reason: reason.into(),
    }
}

fn size(text: &Value, key: &str) -> Result<usize, PackError> {
    text.get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| refused("config.json", format!("text_config.{key} is missing")))
}

fn width(t: &TensorSource) -> Result<u64, PackError> {
    match t.dtype {
        Dtype::F32 => Ok(4),
        Dtype::BF16 => Ok(2),
        other => Err(refused(
            &t.name,
            format!("is {other:?}; the published layout stores non-expert tensors as F32 or BF16"),
        )),
    }
}

/// `[rows, cols]` of a tensor as its band table states it (a 1-D tensor is one row).
fn rows_cols(t: &TensorSource) -> (u64, u64) {
    match t.shape.as_slice() {
        [] => (1, 1),
        [n] => (1, *n as u64),
        [rows, rest @ ..] => (*rows as u64, rest.iter().product::<usize>() as u64),
    }
}

fn role(name: &str) -> &'static str {
    if name.contains("shared_experts") {
        "shared_expert"
    } else if name.contains("routed_expert_norm") {
        "latent_norm"
    } else if name.contains("routed_expert_") {
        "latent"
    } else if name.contains("block_sparse_moe.gate") {
        "router"
    } else if name.contains("self_attn.") && !name.contains("layernorm") {
        "attention"
    } else if name.contains(".mlp.") {
        "dense_mlp"
    } else {
        "norm"
    }
}

/// Writes the published layout of the checkpoint at `source` into `out` (absent, empty, or an
/// earlier pack's output, as for [`crate::pack()`]).
pub fn pack_k3_published(source: &Path, out: &Path, bands: BandSizes) -> Result<(), PackError> {
    let ckpt = Checkpoint::open(source)?;
    let text = ckpt.config.get("text_config").ok_or_else(|| {
        refused(
            "config.json",
            "has no text_config: not a Kimi K3 configuration",
        )
    })?;
    let layers = size(text, "num_hidden_layers")?;
    let root = match ckpt
        .tensors
        .contains_key("language_model.model.embed_tokens.weight")
    {
        true => "language_model.",
        false => "",
    };
    prepare_output(out)?;
    let mut total = write_globals(&ckpt, out, text, root)?;
    let mut files = 3;
    for layer in 0..layers {
        let (n, bytes) = write_layer(&ckpt, out, text, root, layer, bands)?;
        files += n;
        total += bytes;
    }
    for name in &ckpt.other_files {
        copy_verbatim(&ckpt.dir.join(name), &out.join(name))?;
    }
    let index = json!({
        "format": "quantized_tile_container",
        "format_version": 1,
        "relationship": "byte_preserving_repack",
        "layers": layers,
        "globals": 1,
        "files": files,
        "bytes": total,
    });
    atomic_file::write_bytes(&out.join("index.json"), format!("{index:#}\n").as_bytes())?;
    std::fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
    atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
    Ok(())
}

fn tensor<'c>(ckpt: &'c Checkpoint, name: &str) -> Result<&'c TensorSource, PackError> {
    ckpt.tensors
        .get(name)
        .ok_or_else(|| refused(name, "is not in the checkpoint"))
}

fn bytes_of(ckpt: &Checkpoint, t: &TensorSource) -> Result<Vec<u8>, PackError> {
    let mut buf = Vec::new();
    read_slice_into(&ckpt.dir, t, 0, t.len, &mut buf)?;
    Ok(buf)
}

fn write_globals(
    ckpt: &Checkpoint,
    out: &Path,
    text: &Value,
    root: &str,
) -> Result<u64, PackError> {
    let (vocab, hidden) = (
        size(text, "vocab_size")? as u64,
        size(text, "hidden_size")? as u64,
    );
    let dir = out.join("global");
    std::fs::create_dir_all(&dir).map_err(|e| PackError::io(&dir, e))?;
    let mut total = 0;
    for (file, name) in [
        (
            "embed_tokens.bin",
            format!("{root}model.embed_tokens.weight"),
        ),
        ("lm_head.bin", format!("{root}lm_head.weight")),
    ] {
        let t = tensor(ckpt, &name)?;
        if t.dtype != Dtype::BF16 || t.len != vocab * hidden * 2 {
            return Err(refused(&name, format!("is not BF16 [{vocab}, {hidden}]")));
        }
        atomic_file::write_bytes(&dir.join(file), &bytes_of(ckpt, t)?)?;
        total += t.len;
    }
    let mut final_bin = vec![0u8; 3 * ALIGNMENT as usize];
    for (unit, which) in FINAL_TENSORS.iter().enumerate() {
        let name = match *which {
            "norm" => format!("{root}model.norm.weight"),
            "output_attn_res_norm" => format!("{root}model.output_attn_res.norm_weight"),
            _ => format!("{root}model.output_attn_res.proj_weight"),
        };
        let t = tensor(ckpt, &name)?;
        if t.dtype != Dtype::BF16 || t.len != hidden * 2 || t.len > ALIGNMENT {
            return Err(refused(&name, format!("is not a BF16 [{hidden}] vector")));
        }
        let at = unit * ALIGNMENT as usize;
        final_bin[at..at + t.len as usize].copy_from_slice(&bytes_of(ckpt, t)?);
    }
    atomic_file::write_bytes(&dir.join("final.bin"), &final_bin)?;
    let manifest =
        json!({"unit": "global", "files": ["embed_tokens.bin", "lm_head.bin", "final.bin"]});
    atomic_file::write_bytes(
        &dir.join("manifest.json"),
        format!("{manifest:#}\n").as_bytes(),
    )?;
    Ok(total + final_bin.len() as u64)
}

/// Writes layer `layer`; returns its payload files and bytes.
fn write_layer(
    ckpt: &Checkpoint,
    out: &Path,
    text: &Value,
    root: &str,
    layer: usize,
    bands: BandSizes,
) -> Result<(usize, u64), PackError> {
    let unit = format!("layer{layer:02}");
    let dir = out.join(&unit);
    std::fs::create_dir_all(&dir).map_err(|e| PackError::io(&dir, e))?;
    let prefix = format!("{root}model.layers.{layer}.");
    let experts_prefix = format!("{prefix}block_sparse_moe.experts.");
    let deterministic: Vec<&TensorSource> = ckpt
        .tensors
        .range(prefix.clone()..)
        .take_while(|(name, _)| name.starts_with(&prefix))
        .filter(|(name, _)| !name.starts_with(&experts_prefix))
        .map(|(_, t)| t)
        .collect();
    let blob = format!("{unit}-deterministic.bin");
    let mut units = Vec::new();
    let mut by_role: BTreeMap<&str, u64> = BTreeMap::new();
    let mut offset = 0u64;
    atomic_file::write_with(&dir.join(&blob), atomic_file::Options::default(), |file| {
        let mut w = BufWriter::with_capacity(4 << 20, file);
        for t in &deterministic {
            let (rows, cols) = rows_cols(t);
            let row_bytes = cols * width(t)?;
            let per_band = (bands.band_bytes / row_bytes).max(1);
            let data = bytes_of(ckpt, t)?;
            let mut row = 0;
            while row < rows {
                let n = per_band.min(rows - row);
                let payload = &data[(row * row_bytes) as usize..((row + n) * row_bytes) as usize];
                let length = (payload.len() as u64).div_ceil(ALIGNMENT) * ALIGNMENT;
                w.write_all(payload).map_err(|e| PackError::io(&blob, e))?;
                w.write_all(&vec![0u8; (length - payload.len() as u64) as usize])
                    .map_err(|e| PackError::io(&blob, e))?;
                *by_role.entry(role(&t.name)).or_default() += length;
                units.push(json!({
                    "index": units.len(), "tensor": t.name, "role": role(&t.name),
                    "dtype": if width(t)? == 4 { "F32" } else { "BF16" },
                    "row_start": row, "rows": n, "cols": cols, "offset": offset,
                    "length": length, "payload_length": payload.len(),
                    "whole_tensor": row == 0 && n == rows,
                }));
                offset += length;
                row += n;
            }
        }
        w.flush().map_err(|e| PackError::io(&blob, e))
    })?;
    let manifest = json!({
        "format": "quantized_tile_container", "format_version": 1, "layer": layer, "dense": true,
        "nonexpert": {
            "file": blob, "bytes": offset, "unit_count": units.len(),
            "bytes_by_role": by_role, "units": units,
        },
    });
    atomic_file::write_bytes(
        &dir.join("manifest.json"),
        format!("{manifest:#}\n").as_bytes(),
    )?;
    let experts = size(text, "num_experts")?;
    if !ckpt
        .tensors
        .contains_key(&format!("{experts_prefix}0.w1.weight"))
    {
        return Ok((1, offset));
    }
    let mut files = 1;
    let mut total = offset;
    for (projection, rows) in [
        ("w1", bands.expert_band_rows.0),
        ("w3", bands.expert_band_rows.0),
        ("w2", bands.expert_band_rows.1),
    ] {
        total += write_experts(
            ckpt,
            &dir,
            &unit,
            &experts_prefix,
            projection,
            experts,
            rows,
        )?;
        files += 1;
    }
    Ok((files, total))
}

/// One projection's container: tile `slot * bands + band` is band `band` of the expert in
/// `slot`.
fn write_experts(
    ckpt: &Checkpoint,
    dir: &Path,
    unit: &str,
    prefix: &str,
    projection: &str,
    experts: usize,
    band_rows: usize,
) -> Result<u64, PackError> {
    let first = tensor(ckpt, &format!("{prefix}0.{projection}.weight"))?;
    let (out_rows, packed_cols) = match first.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => return Err(refused(&first.name, "is not a matrix")),
    };
    let cols = packed_cols * 8;
    if first.dtype != Dtype::U32 || band_rows == 0 || !out_rows.is_multiple_of(band_rows) {
        return Err(refused(
            &first.name,
            format!(
                "is not MLX MXFP4 (U32) in rows that bands of {band_rows} divide ({out_rows} rows): the published layout bands each expert's rows, and an MXFP4 band must fill whole 16 KiB pages"
            ),
        ));
    }
    let bands = out_rows / band_rows;
    let geometry = Geometry {
        mode: QuantMode::Mxfp4,
        rows: band_rows as u32,
        cols: cols as u32,
        group_size: MXFP4_GROUP,
        bits: 4,
        scale_dtype: ScaleDtype::E8m0,
        scale_block_rows: 1,
        tile_count: (experts * bands) as u32,
    };
    let name = format!("{unit}-{projection}.mxfp4tile");
    let mut bytes = 0;
    atomic_file::write_with(&dir.join(&name), atomic_file::Options::default(), |file| {
        let buffered = BufWriter::with_capacity(4 << 20, file);
        // Version 1, as published: its header cannot say the content is a checkpoint's (it
        // reads as synthetic, seed 0), so no reader may regenerate it from the seed.
        let kind = ContentKind::SyntheticDeterministic;
        let mut writer = ContainerWriter::new(buffered, geometry, kind, 0, false)
            .map_err(|e| refused(&name, e.to_string()))?;
        for e in slot_order(experts) {
            let packed = bytes_of(
                ckpt,
                tensor(ckpt, &format!("{prefix}{e}.{projection}.weight"))?,
            )?;
            let scales = bytes_of(
                ckpt,
                tensor(ckpt, &format!("{prefix}{e}.{projection}.scales"))?,
            )?;
            let (p, s) = (packed.len() / bands, scales.len() / bands);
            for b in 0..bands {
                writer
                    .push_tile(
                        &packed[b * p..(b + 1) * p],
                        &scales[b * s..(b + 1) * s],
                        &[],
                    )
                    .map_err(|e| refused(&name, e.to_string()))?;
            }
        }
        let (mut buffered, container) =
            writer.finish().map_err(|e| refused(&name, e.to_string()))?;
        buffered.flush().map_err(|e| PackError::io(&name, e))?;
        bytes = container.layout.total_bytes;
        Ok::<(), PackError>(())
    })?;
    Ok(bytes)
}
