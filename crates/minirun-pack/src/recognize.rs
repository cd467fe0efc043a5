//! Recognising the upstream's own quantization from config.json and the tensors, and
//! refusing what is not recognised (never guessing):
//!
//! - MLX (`quantization` in config.json): packed U32 `P.weight` + `P.scales` (+ `P.biases`
//!   for affine), group size and bits from the per-module override or the base entry;
//! - gpt-oss MXFP4 (`quantization_config.quant_method = "mxfp4"`): U8 `*_blocks` [.., rows,
//!   cols/32, 16] + U8 `*_scales` [.., rows, cols/32];
//! - FP8 e4m3 block (`quant_method = "fp8"`, `weight_block_size`): F8_E4M3 `P.weight` +
//!   `P.weight_scale_inv` or (DeepSeek V4's name) `P.scale`, the scale element type as stored;
//!   with `expert_dtype = "fp4"` (DeepSeek V4), I8 `P.weight` packing two E2M1 codes a byte
//!   (the earlier column in the low nibble) + E8M0 `P.scale` per 32 columns: MXFP4's bytes;
//! - everything else: a plain tensor, whose bytes travel verbatim.

use std::collections::BTreeSet;

use minirun_format::tile::{QuantMode, ScaleDtype};
use safetensors::tensor::Dtype;
use serde_json::Value;

use crate::PackError;
use crate::checkpoint::Checkpoint;
use crate::shard::TensorSource;

/// A quantized matrix (or a stack of expert matrices) and the tensors that hold it.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    /// The module path, e.g. `model.layers.0.mlp.switch_mlp.gate_proj`.
    pub module: String,
    /// Which upstream layout it came from (`mlx-affine`, `mlx-mxfp4`, `gpt-oss-mxfp4`, `fp8-block`).
    pub scheme: &'static str,
    pub mode: QuantMode,
    pub bits: u32,
    pub group: u32,
    pub scale_dtype: ScaleDtype,
    /// Rows one scale covers (the FP8 block height; 1 otherwise).
    pub block_rows: u32,
    /// Number of stacked experts (the leading dimension), if any.
    pub experts: Option<u32>,
    /// Output rows of one matrix.
    pub rows: u32,
    /// Input columns (the reduction length).
    pub cols: u32,
    pub packed: TensorSource,
    pub scales: TensorSource,
    pub biases: Option<TensorSource>,
}

/// Everything the checkpoint holds, classified.
#[derive(Debug, Clone)]
pub enum Item {
    Quantized(Box<QuantMatrix>),
    Plain(TensorSource),
}

impl Item {
    /// The name the item is sorted and placed by.
    pub fn name(&self) -> &str {
        match self {
            Item::Quantized(q) => &q.packed.name,
            Item::Plain(t) => &t.name,
        }
    }
}

/// The quantization scheme config.json declares.
enum Scheme {
    None,
    Mlx(Value),
    GptOssMxfp4,
    Fp8Block {
        rows: u32,
        cols: u32,
        fp4_experts: bool,
    },
}

/// Classifies every tensor of the checkpoint.
pub fn recognize(ckpt: &Checkpoint) -> Result<Vec<Item>, PackError> {
    let scheme = declared_scheme(&ckpt.config)?;
    let mut used = BTreeSet::new();
    let mut items = Vec::new();
    for t in ckpt.tensors.values() {
        if let Some(q) = quantized_at(ckpt, &scheme, t)? {
            used.insert(q.packed.name.clone());
            used.insert(q.scales.name.clone());
            if let Some(b) = &q.biases {
                used.insert(b.name.clone());
            }
            items.push(Item::Quantized(Box::new(q)));
        }
    }
    for t in ckpt.tensors.values().filter(|t| !used.contains(&t.name)) {
        refuse_unrecognised_quantized(t, &scheme)?;
        items.push(Item::Plain(t.clone()));
    }
    items.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(items)
}

fn refused(what: &str, reason: impl Into<String>) -> PackError {
    PackError::Refused {
        what: what.to_string(),
        reason: reason.into(),
    }
}

fn declared_scheme(config: &Value) -> Result<Scheme, PackError> {
    if let Some(q) = config.get("quantization") {
        return Ok(Scheme::Mlx(q.clone()));
    }
    let Some(qc) = config.get("quantization_config") else {
        return Ok(Scheme::None);
    };
    match qc.get("quant_method").and_then(Value::as_str) {
        Some("mxfp4") => Ok(Scheme::GptOssMxfp4),
        Some("fp8") => {
            let block = qc.get("weight_block_size").and_then(Value::as_array);
            let dims: Option<Vec<u32>> = block.map(|b| {
                b.iter()
                    .filter_map(|v| v.as_u64().and_then(|d| u32::try_from(d).ok()))
                    .collect()
            });
            match dims.as_deref() {
                Some([rows, cols]) if rows.is_power_of_two() && cols.is_power_of_two() => {
                    Ok(Scheme::Fp8Block {
                        rows: *rows,
                        cols: *cols,
                        fp4_experts: expert_dtype(config, qc)?,
                    })
                }
                _ => Err(refused(
                    "config.json",
                    "quant_method fp8 without a [rows, cols] weight_block_size of powers of two",
                )),
            }
        }
        other => Err(refused(
            "config.json",
            format!(
                "quantization_config.quant_method {other:?} is not one this packer recognises (mxfp4, fp8, or MLX's own `quantization`)"
            ),
        )),
    }
}

/// Whether an FP8 checkpoint stores its experts FP4 (`expert_dtype`, at the top level as
/// DeepSeek V4 Flash ships it, or in `quantization_config`): `fp4` or `fp8`, nothing else.
fn expert_dtype(config: &Value, qc: &Value) -> Result<bool, PackError> {
    let declared = [config.get("expert_dtype"), qc.get("expert_dtype")];
    let mut fp4 = None;
    for value in declared.into_iter().flatten() {
        let this = match value.as_str() {
            Some("fp4") => true,
            Some("fp8") => false,
            _ => {
                return Err(refused(
                    "config.json",
                    format!("expert_dtype {value} is neither \"fp4\" nor \"fp8\""),
                ));
            }
        };
        if fp4.is_some_and(|f| f != this) {
            return Err(refused(
                "config.json",
                "expert_dtype differs between the top level and quantization_config",
            ));
        }
        fp4 = Some(this);
    }
    Ok(fp4.unwrap_or(false))
}

/// If `t` is the packed tensor of a quantized matrix under `scheme`, that matrix.
fn quantized_at(
    ckpt: &Checkpoint,
    scheme: &Scheme,
    t: &TensorSource,
) -> Result<Option<QuantMatrix>, PackError> {
    match scheme {
        Scheme::Mlx(q) => match t.name.strip_suffix(".weight") {
            Some(module) if t.dtype == Dtype::U32 => mlx_matrix(ckpt, q, module, t).map(Some),
            _ => Ok(None),
        },
        Scheme::GptOssMxfp4 => match t.name.strip_suffix("_blocks") {
            Some(stem) => gpt_oss_matrix(ckpt, stem, t).map(Some),
            None => Ok(None),
        },
        Scheme::Fp8Block {
            rows,
            cols,
            fp4_experts,
        } => match t.name.strip_suffix(".weight") {
            Some(module) if t.dtype == Dtype::F8_E4M3 => {
                fp8_matrix(ckpt, module, t, *rows, *cols).map(Some)
            }
            Some(module) if t.dtype == Dtype::I8 && *fp4_experts => {
                fp4_matrix(ckpt, module, t).map(Some)
            }
            _ => Ok(None),
        },
        Scheme::None => Ok(None),
    }
}

fn sibling<'a>(ckpt: &'a Checkpoint, name: &str, of: &str) -> Result<&'a TensorSource, PackError> {
    ckpt.tensors
        .get(name)
        .ok_or_else(|| refused(of, format!("looks quantized but {name} is missing")))
}

fn dim(shape: &[usize], from_end: usize) -> u64 {
    shape
        .len()
        .checked_sub(from_end)
        .and_then(|i| shape.get(i))
        .map_or(0, |&d| d as u64)
}

/// Same rank and the same dims before the last `matrix_dims` (the expert dimension).
fn same_leading(a: &[usize], b: &[usize], matrix_dims: usize) -> bool {
    a.len() == b.len()
        && a.get(..a.len().saturating_sub(matrix_dims))
            == b.get(..b.len().saturating_sub(matrix_dims))
}

fn to_u32(v: u64, what: &str) -> Result<u32, PackError> {
    u32::try_from(v)
        .map_err(|_| refused(what, format!("dimension {v} does not fit a tile container")))
}

/// Leading dims before the matrix: none, or one expert dimension.
fn experts_of(shape: &[usize], matrix_dims: usize, what: &str) -> Result<Option<u32>, PackError> {
    match shape.len().checked_sub(matrix_dims) {
        Some(0) => Ok(None),
        Some(1) => Ok(Some(to_u32(dim(shape, shape.len()), what)?)),
        _ => Err(refused(
            what,
            format!("shape {shape:?} is neither a matrix nor a stack of expert matrices"),
        )),
    }
}

fn scale_dtype_of(d: Dtype, what: &str) -> Result<ScaleDtype, PackError> {
    match d {
        Dtype::U8 | Dtype::F8_E8M0 => Ok(ScaleDtype::E8m0),
        Dtype::F16 => Ok(ScaleDtype::F16),
        Dtype::BF16 => Ok(ScaleDtype::Bf16),
        Dtype::F32 => Ok(ScaleDtype::F32),
        other => Err(refused(
            what,
            format!("scales of dtype {other:?} are not a known scale type"),
        )),
    }
}

/// The MLX parameters for `module`: its own override, else the base entry.
fn mlx_params(q: &Value, module: &str) -> Result<(QuantMode, u32, u32), PackError> {
    let entry = match q.get(module) {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(Value::Bool(false)) => {
            return Err(refused(
                module,
                "config.json says this module is not quantized, but its tensors are",
            ));
        }
        _ => q.clone(),
    };
    let num = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let (Some(group), Some(bits)) = (num("group_size"), num("bits")) else {
        return Err(refused(
            module,
            "config.json's quantization entry lacks group_size or bits",
        ));
    };
    let mode = match entry
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("affine")
    {
        "affine" => QuantMode::Affine,
        "mxfp4" => QuantMode::Mxfp4,
        other => {
            return Err(refused(
                module,
                format!("MLX quantization mode {other:?} is not supported"),
            ));
        }
    };
    Ok((mode, bits, group))
}

fn mlx_matrix(
    ckpt: &Checkpoint,
    q: &Value,
    module: &str,
    packed: &TensorSource,
) -> Result<QuantMatrix, PackError> {
    let scales = sibling(ckpt, &format!("{module}.scales"), &packed.name)?;
    let biases = ckpt.tensors.get(&format!("{module}.biases"));
    let (mode, bits, group) = mlx_params(q, module)?;
    let experts = experts_of(&packed.shape, 2, &packed.name)?;
    let rows = dim(&packed.shape, 2);
    let words = dim(&packed.shape, 1);
    let groups = dim(&scales.shape, 1);
    // Shapes come from untrusted shard headers (a zero-element tensor may have huge dims):
    // products that overflow are simply inconsistent.
    let cols = words.saturating_mul(32) / u64::from(bits.max(1));
    let covered = groups.saturating_mul(u64::from(group));
    let consistent = bits != 0
        && group != 0
        && words.checked_mul(32).is_some()
        && groups.checked_mul(u64::from(group)).is_some()
        && dim(&scales.shape, 2) == rows
        && same_leading(&packed.shape, &scales.shape, 2)
        && cols == covered;
    if !consistent {
        return Err(refused(
            &packed.name,
            format!(
                "config.json claims {bits}-bit groups of {group}, but the tensors contradict it: packed {:?} U32 words \
                 hold {cols} columns while scales {:?} cover {} columns",
                packed.shape, scales.shape, covered
            ),
        ));
    }
    match (mode, biases) {
        (QuantMode::Affine, Some(b)) if b.shape == scales.shape && b.dtype == scales.dtype => {}
        (QuantMode::Affine, _) => {
            return Err(refused(
                &packed.name,
                "affine quantization needs biases shaped and typed like its scales",
            ));
        }
        (_, Some(_)) => {
            return Err(refused(
                &packed.name,
                "mxfp4 has no biases, but a .biases tensor is present",
            ));
        }
        (_, None) => {}
    }
    Ok(QuantMatrix {
        module: module.to_string(),
        scheme: if mode == QuantMode::Affine {
            "mlx-affine"
        } else {
            "mlx-mxfp4"
        },
        mode,
        bits,
        group,
        scale_dtype: scale_dtype_of(scales.dtype, &scales.name)?,
        block_rows: 1,
        experts,
        rows: to_u32(rows, &packed.name)?,
        cols: to_u32(cols, &packed.name)?,
        packed: packed.clone(),
        scales: scales.clone(),
        biases: biases.cloned(),
    })
}

fn gpt_oss_matrix(
    ckpt: &Checkpoint,
    stem: &str,
    blocks: &TensorSource,
) -> Result<QuantMatrix, PackError> {
    let scales = sibling(ckpt, &format!("{stem}_scales"), &blocks.name)?;
    let experts = experts_of(&blocks.shape, 3, &blocks.name)?;
    let (rows, groups) = (dim(&blocks.shape, 3), dim(&blocks.shape, 2));
    let ok = blocks.dtype == Dtype::U8
        && scales.dtype == Dtype::U8
        && dim(&blocks.shape, 1) == 16
        && scales.shape.len() + 1 == blocks.shape.len()
        && blocks.shape.get(..blocks.shape.len().saturating_sub(3))
            == scales.shape.get(..scales.shape.len().saturating_sub(2))
        && dim(&scales.shape, 2) == rows
        && dim(&scales.shape, 1) == groups;
    if !ok {
        return Err(refused(
            &blocks.name,
            format!(
                "gpt-oss MXFP4 needs U8 blocks [.., rows, cols/32, 16] and U8 scales [.., rows, cols/32]; found {:?} {:?} and {:?} {:?}",
                blocks.dtype, blocks.shape, scales.dtype, scales.shape
            ),
        ));
    }
    Ok(QuantMatrix {
        module: stem.to_string(),
        scheme: "gpt-oss-mxfp4",
        mode: QuantMode::Mxfp4,
        bits: 4,
        group: 32,
        scale_dtype: ScaleDtype::E8m0,
        block_rows: 1,
        experts,
        rows: to_u32(rows, &blocks.name)?,
        cols: to_u32(groups.saturating_mul(32), &blocks.name)?,
        packed: blocks.clone(),
        scales: scales.clone(),
        biases: None,
    })
}

fn fp8_matrix(
    ckpt: &Checkpoint,
    module: &str,
    weight: &TensorSource,
    block_rows: u32,
    block_cols: u32,
) -> Result<QuantMatrix, PackError> {
    let scales = match ckpt.tensors.get(&format!("{module}.scale")) {
        Some(deepseek_v4)
            if !ckpt
                .tensors
                .contains_key(&format!("{module}.weight_scale_inv")) =>
        {
            deepseek_v4
        }
        _ => sibling(ckpt, &format!("{module}.weight_scale_inv"), &weight.name)?,
    };
    let experts = experts_of(&weight.shape, 2, &weight.name)?;
    let (rows, cols) = (dim(&weight.shape, 2), dim(&weight.shape, 1));
    let grid = (
        rows.div_ceil(u64::from(block_rows)),
        cols.div_ceil(u64::from(block_cols)),
    );
    if scales.shape.len() != weight.shape.len()
        || !same_leading(&weight.shape, &scales.shape, 2)
        || (dim(&scales.shape, 2), dim(&scales.shape, 1)) != grid
    {
        return Err(refused(
            &weight.name,
            format!(
                "FP8 blocks of {block_rows}x{block_cols} over {rows}x{cols} need a {}x{} scale grid, but {} is {:?}",
                grid.0, grid.1, scales.name, scales.shape
            ),
        ));
    }
    Ok(QuantMatrix {
        module: module.to_string(),
        scheme: "fp8-block",
        mode: QuantMode::Fp8E4m3Block,
        bits: 8,
        group: block_cols,
        scale_dtype: scale_dtype_of(scales.dtype, &scales.name)?,
        block_rows,
        experts,
        rows: to_u32(rows, &weight.name)?,
        cols: to_u32(cols, &weight.name)?,
        packed: weight.clone(),
        scales: scales.clone(),
        biases: None,
    })
}

/// DeepSeek V4's FP4 experts: I8 `[rows, cols/2]` codes and E8M0 `[rows, cols/32]` scales,
/// the bytes of an MXFP4 matrix.
fn fp4_matrix(
    ckpt: &Checkpoint,
    module: &str,
    weight: &TensorSource,
) -> Result<QuantMatrix, PackError> {
    let scales = sibling(ckpt, &format!("{module}.scale"), &weight.name)?;
    let experts = experts_of(&weight.shape, 2, &weight.name)?;
    let (rows, half) = (dim(&weight.shape, 2), dim(&weight.shape, 1));
    let cols = half.saturating_mul(2);
    let ok = matches!(scales.dtype, Dtype::F8_E8M0 | Dtype::U8)
        && scales.shape.len() == weight.shape.len()
        && same_leading(&weight.shape, &scales.shape, 2)
        && dim(&scales.shape, 2) == rows
        && cols.is_multiple_of(32)
        && dim(&scales.shape, 1) == cols / 32;
    if !ok {
        return Err(refused(
            &weight.name,
            format!(
                "FP4 experts need I8 codes [.., rows, cols/2] and E8M0 scales [.., rows, cols/32]; found {:?} and {} {:?} {:?}",
                weight.shape, scales.name, scales.dtype, scales.shape
            ),
        ));
    }
    Ok(QuantMatrix {
        module: module.to_string(),
        scheme: "deepseek-fp4",
        mode: QuantMode::Mxfp4,
        bits: 4,
        group: 32,
        scale_dtype: ScaleDtype::E8m0,
        block_rows: 1,
        experts,
        rows: to_u32(rows, &weight.name)?,
        cols: to_u32(cols, &weight.name)?,
        packed: weight.clone(),
        scales: scales.clone(),
        biases: None,
    })
}

/// A tensor that looks like a quantized payload but belongs to no recognised matrix is a
/// layout this packer does not know: refuse rather than copy it as if it were plain.
fn refuse_unrecognised_quantized(t: &TensorSource, scheme: &Scheme) -> Result<(), PackError> {
    let suspicious = match t.dtype {
        Dtype::F8_E4M3
        | Dtype::F8_E5M2
        | Dtype::F8_E8M0
        | Dtype::F4
        | Dtype::F6_E2M3
        | Dtype::F6_E3M2 => true,
        Dtype::U32 | Dtype::I8 => t.name.ends_with(".weight"),
        _ => {
            t.name.ends_with("_blocks")
                || t.name.ends_with(".scales")
                || t.name.ends_with("_scale_inv")
        }
    };
    if !suspicious {
        return Ok(());
    }
    let declared = match scheme {
        Scheme::None => "config.json declares no quantization",
        _ => "it matches none of the quantized layouts config.json declares",
    };
    Err(refused(
        &t.name,
        format!(
            "this {:?} tensor looks quantized, but {declared}; refusing to guess",
            t.dtype
        ),
    ))
}
