//! Writes the published Kimi K3 layout (`docs/formats/k3-published.md`) from a K3 checkpoint
//! under the upstream tensor names or mlx-lm's, with its routed experts in MLX MXFP4 and every
//! other tensor F32 or BF16: `global/` (embedding, LM head, `final.bin`), and per layer the
//! row-banded deterministic blob with its manifest and the three banded expert containers,
//! experts in the text order of their numbers. The values are the checkpoint's, bit for bit:
//! under the upstream names every byte is copied; mlx-lm's fused and renamed tensors are mapped
//! back exactly ([`crate::k3_names`]). The expert containers are the same bytes either way.
//!
//! The band heights are this writer's choice (the layout's readers depend only on the band
//! table and the container headers): a deterministic tensor's bands are the most rows that fit
//! in `band_bytes` rounded down to a power of two, an expert's as `expert_band_rows` says.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use minirun_format::artifact::INCOMPLETE_MARKER;
use minirun_format::artifact::k3_published::slot_order;
use minirun_format::tile::{
    ALIGNMENT, ContainerWriter, ContentKind, Geometry, MXFP4_GROUP, QuantMode, ScaleDtype,
};
use safetensors::tensor::Dtype;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::PackError;
use crate::checkpoint::Checkpoint;
pub use crate::k3_names::Naming;
use crate::k3_names::{EXPERT_PROJECTIONS, K3Plan, LayerExperts, LayerPlan, Planned};
use crate::pack::{PackOptions, check_provenance, copy_verbatim, prepare_output};
use crate::shard::TensorSource;

/// Band heights.
#[derive(Debug, Clone, Copy)]
pub struct BandSizes {
    /// The most bytes of one deterministic band (at least one row; the rows are a power of two).
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

/// What a write did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct K3Summary {
    /// `upstream` or `mlx`: which names the checkpoint used.
    pub naming: &'static str,
    pub layers: usize,
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

fn size(text: &Value, key: &str) -> Result<usize, PackError> {
    text.get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| refused("config.json", format!("text_config.{key} is missing")))
}

fn width(t: &Planned) -> Result<u64, PackError> {
    match t.dtype {
        Dtype::F32 => Ok(4),
        Dtype::BF16 => Ok(2),
        other => Err(refused(
            &t.name,
            format!(
                "is {other:?}; the published layout stores non-expert tensors as F32 or BF16 (a checkpoint quantized beyond its routed experts cannot be written into it)"
            ),
        )),
    }
}

/// `[rows, cols]` of a tensor as its band table states it (a 1-D tensor is one row).
fn rows_cols(t: &Planned) -> (u64, u64) {
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
/// earlier pack's output, as for [`crate::pack()`]). With the upstream's repository and pinned
/// revision in `opts`, `index.json` names them as the published one does, with the tokenizer's
/// identity. `progress` is called with payload bytes as they are written.
pub fn pack_k3_published(
    source: &Path,
    out: &Path,
    bands: BandSizes,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<K3Summary, PackError> {
    check_provenance(opts)?;
    let ckpt = Checkpoint::open(source)?;
    let plan = K3Plan::new(&ckpt)?;
    let text = ckpt
        .config
        .get("text_config")
        .ok_or_else(|| refused("config.json", "has no text_config"))?;
    check_written_dtypes(&plan)?;
    check_bands(&plan, bands)?;
    prepare_output(out, &ckpt.other_files)?;
    let mut total = write_globals(&ckpt, &plan, out, text)?;
    progress(total);
    let mut files = 3;
    for (layer, layer_plan) in plan.layers.iter().enumerate() {
        let upstream = opts.source_repo.as_deref();
        let (n, bytes) = write_layer(&ckpt, layer_plan, out, layer, bands, upstream, progress)?;
        files += n;
        total += bytes;
    }
    for name in &ckpt.other_files {
        copy_verbatim(&ckpt.dir.join(name), &out.join(name))?;
    }
    let index = index_json(&ckpt, opts, plan.layers.len(), files, total)?;
    atomic_file::write_bytes(&out.join("index.json"), format!("{index:#}\n").as_bytes())?;
    std::fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
    atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
    Ok(K3Summary {
        naming: match plan.naming {
            Naming::Upstream => "upstream",
            Naming::Mlx => "mlx",
        },
        layers: plan.layers.len(),
        payload_files: files,
        payload_bytes: total,
        copied_files: ckpt.other_files.clone(),
    })
}

/// Every deterministic tensor is refused before a byte is written when it is not F32 or BF16.
fn check_written_dtypes(plan: &K3Plan) -> Result<(), PackError> {
    for t in plan.layers.iter().flat_map(|l| l.deterministic.iter()) {
        width(t)?;
    }
    Ok(())
}

/// The published index: format, the upstream it repacks (when known) and the tokenizer's
/// identity, totals.
fn index_json(
    ckpt: &Checkpoint,
    opts: &PackOptions,
    layers: usize,
    files: usize,
    bytes: u64,
) -> Result<Value, PackError> {
    let mut index = json!({
        "format": "quantized_tile_container",
        "format_version": 1,
    });
    if let (Some(repo), Some(revision)) = (&opts.source_repo, &opts.source_revision) {
        index["source_repo"] = repo.as_str().into();
        index["source_revision"] = revision.as_str().into();
    }
    index["relationship"] = "byte_preserving_repack".into();
    index["layers"] = layers.into();
    index["globals"] = 1.into();
    index["files"] = files.into();
    index["bytes"] = bytes.into();
    let licence = ckpt
        .other_files
        .iter()
        .find(|f| f.to_ascii_lowercase().starts_with("licen"));
    let tokenizer = ckpt.other_files.iter().any(|f| f == "tiktoken.model");
    if let (Some(repo), Some(revision), Some(licence), true) =
        (&opts.source_repo, &opts.source_revision, licence, tokenizer)
    {
        let path = ckpt.dir.join("tiktoken.model");
        let data = std::fs::read(&path).map_err(|e| PackError::io(&path, e))?;
        index["tokenizer"] = json!({
            "file": "tiktoken.model",
            "bytes": data.len(),
            "sha256": minirun_format::tile::hex(&Sha256::digest(&data)),
            "source_repo": repo,
            "source_revision": revision,
            "license": licence,
        });
    }
    Ok(index)
}

fn bytes_of(ckpt: &Checkpoint, t: &TensorSource) -> Result<Vec<u8>, PackError> {
    crate::k3_names::Piece::Bytes {
        from: t,
        start: 0,
        len: t.len,
    }
    .read(ckpt)
}

fn write_globals(
    ckpt: &Checkpoint,
    plan: &K3Plan,
    out: &Path,
    text: &Value,
) -> Result<u64, PackError> {
    let (vocab, hidden) = (
        size(text, "vocab_size")? as u64,
        size(text, "hidden_size")? as u64,
    );
    let dir = out.join("global");
    std::fs::create_dir_all(&dir).map_err(|e| PackError::io(&dir, e))?;
    let mut total = 0;
    for (file, t) in [
        ("embed_tokens.bin", plan.embed),
        ("lm_head.bin", plan.lm_head),
    ] {
        if t.dtype != Dtype::BF16 || t.len != vocab * hidden * 2 {
            return Err(refused(&t.name, format!("is not BF16 [{vocab}, {hidden}]")));
        }
        atomic_file::write_bytes(&dir.join(file), &bytes_of(ckpt, t)?)?;
        total += t.len;
    }
    let mut final_bin = vec![0u8; 3 * ALIGNMENT as usize];
    for (unit, t) in plan.finals.iter().enumerate() {
        if t.dtype != Dtype::BF16 || t.len != hidden * 2 || t.len > ALIGNMENT {
            return Err(refused(&t.name, format!("is not a BF16 [{hidden}] vector")));
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

/// Writes layer `layer` (its manifest naming the upstream repository when known, as the
/// published ones do); returns its payload files and bytes.
fn write_layer(
    ckpt: &Checkpoint,
    plan: &LayerPlan,
    out: &Path,
    layer: usize,
    bands: BandSizes,
    upstream: Option<&str>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(usize, u64), PackError> {
    let unit = format!("layer{layer:02}");
    let dir = out.join(&unit);
    std::fs::create_dir_all(&dir).map_err(|e| PackError::io(&dir, e))?;
    let blob = format!("{unit}-deterministic.bin");
    let mut units = Vec::new();
    let mut by_role: BTreeMap<&str, u64> = BTreeMap::new();
    let mut offset = 0u64;
    atomic_file::write_with(&dir.join(&blob), atomic_file::Options::default(), |file| {
        let mut w = BufWriter::with_capacity(4 << 20, file);
        for t in &plan.deterministic {
            let (rows, cols) = rows_cols(t);
            let row_bytes = cols * width(t)?;
            let per_band = band_rows_of(bands.band_bytes, row_bytes);
            let data = t.piece.read(ckpt)?;
            if data.len() as u64 != rows * row_bytes {
                return Err(refused(&t.name, "holds other than its shape's bytes"));
            }
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
            progress(data.len() as u64);
        }
        w.flush().map_err(|e| PackError::io(&blob, e))
    })?;
    let max_unit_bytes = units.iter().filter_map(|u| u["length"].as_u64()).max();
    let mut manifest = json!({"format": "quantized_tile_container", "format_version": 1});
    if let Some(repo) = upstream {
        manifest["source_repo"] = repo.into();
    }
    manifest["layer"] = layer.into();
    manifest["dense"] = true.into();
    manifest["nonexpert"] = json!({
        "file": blob, "bytes": offset, "unit_count": units.len(),
        "max_unit_bytes": max_unit_bytes, "bytes_by_role": by_role, "units": units,
    });
    atomic_file::write_bytes(
        &dir.join("manifest.json"),
        format!("{manifest:#}\n").as_bytes(),
    )?;
    let Some(experts) = &plan.experts else {
        return Ok((1, offset));
    };
    let mut total = offset;
    for k in 0..EXPERT_PROJECTIONS.len() {
        let rows = band_rows(k, bands);
        total += write_experts(ckpt, experts, k, &dir, &unit, rows, progress)?;
    }
    Ok((4, total))
}

/// Rows in one band of a tensor whose rows are `row_bytes` long: the most rows that fit in
/// `band_bytes`, rounded down to a power of two (at least one). The published K3's blobs have
/// exactly the sizes this gives: a power-of-two band of a K3 tensor fills whole 16 KiB pages,
/// where as many rows as fit would leave padding in every band of, say, a 12,288-wide
/// `o_proj`.
fn band_rows_of(band_bytes: u64, row_bytes: u64) -> u64 {
    let fit = (band_bytes / row_bytes.max(1)).max(1);
    1 << fit.ilog2()
}

/// Rows per band of projection `k`: w2's own size, or w1's and w3's.
fn band_rows(k: usize, bands: BandSizes) -> usize {
    match EXPERT_PROJECTIONS[k].0 {
        "w2" => bands.expert_band_rows.1,
        _ => bands.expert_band_rows.0,
    }
}

/// Every routed expert's projections split into whole bands: checked for every layer before the
/// output directory is touched, so a refusal leaves nothing half written.
fn check_bands(plan: &K3Plan, bands: BandSizes) -> Result<(), PackError> {
    for (layer, layer_plan) in plan.layers.iter().enumerate() {
        let Some(experts) = &layer_plan.experts else {
            continue;
        };
        for (k, &(out_rows, _)) in experts.shapes.iter().enumerate() {
            check_whole_bands(
                &format!("layer{layer:02}"),
                k,
                out_rows,
                band_rows(k, bands),
            )?;
        }
    }
    Ok(())
}

fn check_whole_bands(
    unit: &str,
    k: usize,
    out_rows: usize,
    band_rows: usize,
) -> Result<(), PackError> {
    let projection = EXPERT_PROJECTIONS[k].0;
    if band_rows == 0 || !out_rows.is_multiple_of(band_rows) {
        return Err(refused(
            format!("{unit}-{projection}.mxfp4tile"),
            format!(
                "{out_rows} rows of {projection} are not whole bands of {band_rows}: the published layout bands each expert's rows"
            ),
        ));
    }
    Ok(())
}

/// One projection's container: tile `slot * bands + band` is band `band` of the expert in
/// `slot`. `check_bands` ran before the output was touched: `band_rows` is not zero and divides
/// the projection's rows.
fn write_experts(
    ckpt: &Checkpoint,
    experts: &LayerExperts,
    k: usize,
    dir: &Path,
    unit: &str,
    band_rows: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, PackError> {
    let projection = EXPERT_PROJECTIONS[k].0;
    let name = format!("{unit}-{projection}.mxfp4tile");
    let (out_rows, cols) = experts.shapes[k];
    let count = experts.pieces[k].len();
    let bands = out_rows / band_rows;
    let geometry = Geometry {
        mode: QuantMode::Mxfp4,
        rows: band_rows as u32,
        cols: cols as u32,
        group_size: MXFP4_GROUP,
        bits: 4,
        scale_dtype: ScaleDtype::E8m0,
        scale_block_rows: 1,
        tile_count: (count * bands) as u32,
    };
    let mut bytes = 0;
    atomic_file::write_with(&dir.join(&name), atomic_file::Options::default(), |file| {
        let buffered = BufWriter::with_capacity(4 << 20, file);
        // Version 1, as published: its header cannot say the content is a checkpoint's (it
        // reads as synthetic, seed 0), so no reader may regenerate it from the seed.
        let kind = ContentKind::SyntheticDeterministic;
        let mut writer = ContainerWriter::new(buffered, geometry, kind, 0, false)
            .map_err(|e| refused(&name, e.to_string()))?;
        for e in slot_order(count) {
            let pieces = &experts.pieces[k][e];
            let packed = pieces.packed.read(ckpt)?;
            let scales = pieces.scales.read(ckpt)?;
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
            progress((packed.len() + scales.len()) as u64);
        }
        let (mut buffered, container) =
            writer.finish().map_err(|e| refused(&name, e.to_string()))?;
        buffered.flush().map_err(|e| PackError::io(&name, e))?;
        bytes = container.layout.total_bytes;
        Ok::<(), PackError>(())
    })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::band_rows_of;

    #[test]
    fn deterministic_bands_are_the_most_rows_that_fit_rounded_to_a_power_of_two() {
        let band = 256 * 7168 * 2;
        // K3's 7,168-wide BF16 tensors: 256 rows, the whole band.
        assert_eq!(band_rows_of(band, 7168 * 2), 256);
        // A 12,288-wide o_proj: 149 rows would fit; 128 fill whole pages.
        assert_eq!(band_rows_of(band, 12288 * 2), 128);
        // The dense layer's 33,792-wide down_proj: 54 would fit.
        assert_eq!(band_rows_of(band, 33792 * 2), 32);
        // A row longer than a band is a band of its own.
        assert_eq!(band_rows_of(16384, 40000), 1);
        assert_eq!(band_rows_of(16384, 16384), 1);
        assert_eq!(band_rows_of(16384, 8192), 2);
    }
}
