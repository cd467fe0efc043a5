//! The tensor index: where each stored tensor's matrices are (tiles, slices of blob members, or
//! row bands), checked against the shape the model asks for, without a payload byte read.

use std::ops::Range;

use minirun_format::artifact::Member;
use minirun_format::tile::{QuantMode, ScaleDtype};
use minirun_kernels::{BlockScale, Format};

use super::kernel_formats::{float_type, quantized_format, scale_float};
use super::part_layout::{PartLayout, Piece, StackLayout};
use super::{Artifact, ArtifactError, Location, tensor_err};

pub(super) fn not_a_member(name: &str, location: Option<&Location>) -> ArtifactError {
    match location {
        Some(_) => tensor_err(
            name,
            "is a tile container where a plain tensor is expected".to_string(),
        ),
        None => ArtifactError::Missing(name.to_string()),
    }
}

/// The `count` equal slices of each member (experts, heads); refused when a length does not
/// divide evenly (a manifest that contradicts itself).
pub(super) fn split(
    name: &str,
    packed: Piece,
    count: usize,
    scales: Option<Piece>,
    biases: Option<Piece>,
) -> Result<Vec<PartLayout>, ArtifactError> {
    let count64 = count as u64;
    let even = |p: &Option<Piece>| p.as_ref().is_none_or(|p| p.len.is_multiple_of(count64));
    if !(count > 0
        && count64 <= packed.len
        && packed.len.is_multiple_of(count64)
        && even(&scales)
        && even(&biases))
    {
        return Err(tensor_err(
            name,
            format!(
                "does not split into {count} equal matrices ({} packed bytes)",
                packed.len
            ),
        ));
    }
    let piece = |p: &Piece, i: u64| {
        let len = p.len / count64;
        Piece {
            tensor: p.tensor.clone(),
            file: p.file,
            offset: p.offset + len * i,
            start: len * i,
            len,
        }
    };
    Ok((0..count64)
        .map(|i| PartLayout::Pieces {
            packed: piece(&packed, i),
            scales: scales.as_ref().map(|p| piece(p, i)),
            biases: biases.as_ref().map(|p| piece(p, i)),
        })
        .collect())
}

/// `[count.., rows, cols]` with the leading dimensions multiplied; rank 2 gives a count of 1.
pub(super) fn leading(name: &str, shape: &[usize]) -> Result<(usize, usize, usize), ArtifactError> {
    match shape {
        [rows, cols] => Ok((1, *rows, *cols)),
        [count, rows, cols] if *count > 0 => Ok((*count, *rows, *cols)),
        _ => Err(tensor_err(
            name,
            format!("has shape {shape:?}, not a matrix or a stack of matrices"),
        )),
    }
}

impl Artifact {
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A blob member's description, without reading it.
    pub(super) fn member_entry(&self, name: &str) -> Result<(usize, &Member), ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member { file, member, .. }) => Ok((*file, member)),
            other => Err(not_a_member(name, other)),
        }
    }

    /// Where the matrices of module `module` are stored, checked against the shape the caller
    /// needs, without reading them.
    pub fn stack_layout(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<StackLayout, ArtifactError> {
        let name = self.weight_name(module);
        let layout = match self.tensors.get(&name) {
            None => return Err(ArtifactError::Missing(name)),
            Some(Location::Tiled { file, tile }) => self.tiled(&name, *file, *tile)?,
            Some(Location::Member { .. }) => self.plain_matrix(module, &name)?,
            Some(Location::Banded {
                format,
                rows,
                cols,
                part,
                ..
            }) => StackLayout {
                name: name.clone(),
                format: *format,
                rows: *rows,
                cols: *cols,
                parts: vec![part.clone()],
            },
        };
        if (layout.rows, layout.cols) != (rows, cols) {
            return Err(tensor_err(
                &name,
                format!(
                    "is {} x {}; config.json implies {rows} x {cols}",
                    layout.rows, layout.cols
                ),
            ));
        }
        Ok(layout)
    }

    pub(super) fn tiled(
        &self,
        name: &str,
        file: usize,
        only: Option<u64>,
    ) -> Result<StackLayout, ArtifactError> {
        let Some(c) = &self.payload[file].container else {
            return Err(tensor_err(name, "has no container header".into()));
        };
        let g = &c.geometry;
        let format = match (g.mode, g.scale_dtype) {
            (QuantMode::Affine, dtype) => Format::Affine {
                bits: g.bits,
                group: g.group_size as usize,
                scale: scale_float(dtype)
                    .ok_or_else(|| tensor_err(name, "affine with e8m0 scales".into()))?,
            },
            (QuantMode::Mxfp4, _) => Format::Mxfp4,
            (QuantMode::Fp8E4m3Block, dtype) => Format::Fp8Block {
                block_rows: g.scale_block_rows as usize,
                block_cols: g.group_size as usize,
                scale: match dtype {
                    ScaleDtype::E8m0 => BlockScale::E8m0,
                    other => BlockScale::Float(
                        scale_float(other).ok_or_else(|| tensor_err(name, "bad scale".into()))?,
                    ),
                },
            },
        };
        let mut parts = Vec::new();
        let tiles = match only {
            Some(t) if t < u64::from(g.tile_count) => t..t + 1,
            Some(t) => return Err(tensor_err(name, format!("has no tile {t}"))),
            None => 0..u64::from(g.tile_count),
        };
        for index in tiles {
            let err = |e: minirun_format::tile::TileError| tensor_err(name, e.to_string());
            let tile = c.tile_range(index).map_err(err)?;
            let relative = |r: Range<u64>| r.start - tile.start..r.end - tile.start;
            parts.push(PartLayout::Tile {
                file,
                index,
                packed: relative(c.packed_range(index).map_err(err)?),
                scales: relative(c.scale_range(index).map_err(err)?),
                biases: c.bias_range(index).map_err(err)?.map(relative),
                tile,
            });
        }
        Ok(StackLayout {
            name: name.to_string(),
            format,
            rows: g.rows as usize,
            cols: g.cols as usize,
            parts,
        })
    }

    /// The stored name of module `module`'s matrix: `{module}.weight`, or gpt-oss's
    /// `{module}_blocks` (OpenAI's MXFP4 codes, kept under their upstream name).
    pub(super) fn weight_name(&self, module: &str) -> String {
        let usual = format!("{module}.weight");
        let blocks = format!("{module}_blocks");
        match !self.tensors.contains_key(&usual) && self.tensors.contains_key(&blocks) {
            true => blocks,
            false => usual,
        }
    }

    /// Whether the artifact stores a matrix for module `module` (metadata only).
    pub fn has_matrix(&self, module: &str) -> bool {
        self.tensors.contains_key(&self.weight_name(module))
    }

    pub(super) fn plain_matrix(
        &self,
        module: &str,
        name: &str,
    ) -> Result<StackLayout, ArtifactError> {
        let (file, member) = self.member_entry(name)?;
        let shape = &member.source.shape;
        let whole = |tensor: &str, file: usize, m: &Member| Piece {
            tensor: tensor.to_string(),
            file,
            offset: m.offset,
            start: 0,
            len: m.source.bytes,
        };
        let Some(q) = &member.quantization else {
            let dtype = float_type(&member.source.dtype).ok_or_else(|| {
                tensor_err(
                    name,
                    format!("is {} and not recorded as quantized", member.source.dtype),
                )
            })?;
            let (count, rows, cols) = leading(name, shape)?;
            return Ok(StackLayout {
                name: name.to_string(),
                format: Format::Dense(dtype),
                rows,
                cols,
                parts: split(name, whole(name, file, member), count, None, None)?,
            });
        };
        let format = quantized_format(name, q)?;
        // DeepSeek V4 names both its FP8 block scales and its FP4 expert scales `.scale`;
        // gpt-oss its MXFP4 scales `_scales`, beside its `_blocks`.
        let either = |usual: String| match self.tensors.contains_key(&usual) {
            true => usual,
            false if name.ends_with("_blocks") => format!("{module}_scales"),
            false => format!("{module}.scale"),
        };
        let (scales_name, biases_name) = match q.layout {
            QuantMode::Fp8E4m3Block => (either(format!("{name}_scale_inv")), None),
            QuantMode::Affine => (format!("{module}.scales"), Some(format!("{module}.biases"))),
            QuantMode::Mxfp4 => (either(format!("{module}.scales")), None),
        };
        let (scales_file, scales_member) = self.member_entry(&scales_name)?;
        let expected_scale_dtype = match q.scale_dtype {
            ScaleDtype::E8m0 => ["U8", "F8_E8M0"].as_slice(),
            ScaleDtype::F16 => ["F16"].as_slice(),
            ScaleDtype::Bf16 => ["BF16"].as_slice(),
            ScaleDtype::F32 => ["F32"].as_slice(),
        };
        if !expected_scale_dtype.contains(&scales_member.source.dtype.as_str()) {
            return Err(tensor_err(
                &scales_name,
                format!(
                    "is {}, but the manifest records {} scales",
                    scales_member.source.dtype, q.scale_dtype
                ),
            ));
        }
        let biases = match &biases_name {
            Some(b) => {
                let (bias_file, bias) = self.member_entry(b)?;
                if bias.source.dtype != scales_member.source.dtype {
                    return Err(tensor_err(
                        b,
                        format!(
                            "is {}, its scales {}",
                            bias.source.dtype, scales_member.source.dtype
                        ),
                    ));
                }
                Some(whole(b, bias_file, bias))
            }
            None => None,
        };
        if q.layout == QuantMode::Fp8E4m3Block && member.source.dtype != "F8_E4M3" {
            return Err(tensor_err(
                name,
                format!(
                    "is {}; only F8_E4M3 elements are implemented",
                    member.source.dtype
                ),
            ));
        }
        // gpt-oss's MXFP4 codes are [.., rows, cols / 32, 16]: one row's bytes are its blocks.
        let merged;
        let shape = match (shape.as_slice(), name.ends_with("_blocks")) {
            ([lead @ .., blocks, 16], true) if q.layout == QuantMode::Mxfp4 => {
                merged = [lead, &[blocks.saturating_mul(16)]].concat();
                &merged
            }
            _ => shape,
        };
        let (count, rows, stored_cols) = leading(name, shape)?;
        let cols = match format {
            Format::Affine { bits, .. } if member.source.dtype == "U32" => {
                stored_cols.saturating_mul(32) / bits as usize
            }
            Format::Mxfp4 if member.source.dtype == "U32" => stored_cols.saturating_mul(8),
            Format::Mxfp4 if matches!(member.source.dtype.as_str(), "I8" | "U8") => {
                stored_cols.saturating_mul(2)
            }
            Format::Fp8Block { .. } => stored_cols,
            _ => {
                return Err(tensor_err(
                    name,
                    format!(
                        "{} stored as {} is not implemented",
                        q.layout, member.source.dtype
                    ),
                ));
            }
        };
        Ok(StackLayout {
            name: name.to_string(),
            format,
            rows,
            cols,
            parts: split(
                name,
                whole(name, file, member),
                count,
                Some(whole(&scales_name, scales_file, scales_member)),
                biases,
            )?,
        })
    }
}
