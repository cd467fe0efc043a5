//! A Kimi K3 checkpoint seen under the upstream tensor names, which the published layout uses:
//! the upstream checkpoint's own names, or mlx-lm's (`kimi_k3`), each tensor traced back to the
//! checkpoint bytes it is made of. mlx-lm's `sanitize` fuses, splits and renames the upstream
//! tensors; every one of those steps is undone exactly here (row slices, a transpose, BF16
//! widened to F32, zero padding), so the values are the checkpoint's, bit for bit.
//!
//! Every checkpoint tensor must be taken by the plan: one left over (a vision tower, an MTP
//! layer, a quantized non-expert tensor's scales) is refused by name, not dropped.

use std::collections::BTreeSet;

use safetensors::tensor::Dtype;
use serde_json::Value;

use crate::PackError;
use crate::checkpoint::Checkpoint;
use crate::shard::{TensorSource, read_slice_into};

/// The expert projections in container order, with mlx-lm's names for them.
pub(crate) const EXPERT_PROJECTIONS: [(&str, &str); 3] =
    [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")];

/// Which names the checkpoint uses (read from its first layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `q/k/v_proj`, `kv_b_proj`, `block_sparse_moe.experts.E.w1`, `*_res.proj_weight`.
    Upstream,
    /// mlx-lm's: `qkv_proj`, `embed_q`/`unembed_out`, `mlp.switch_mlp`, `*_res_proj.weight`.
    Mlx,
}

/// Where a tensor's bytes come from.
#[derive(Debug, Clone)]
pub(crate) enum Piece<'c> {
    /// A byte range of a checkpoint tensor, unchanged: the whole tensor, a run of its rows, or
    /// one expert of a stack.
    Bytes {
        from: &'c TensorSource,
        start: u64,
        len: u64,
    },
    /// A BF16 byte range, each value widened to F32 (exact).
    Widened {
        from: &'c TensorSource,
        start: u64,
        len: u64,
    },
    /// A whole tensor, then zero bytes up to `len`.
    Padded { from: &'c TensorSource, len: u64 },
    /// MLA's `kv_b_proj` `[heads * (nope + v), lora]` from mlx-lm's halves: for each head, the
    /// transpose of `embed_q` `[heads, lora, nope]`, then `unembed_out` `[heads, v, lora]`.
    KvB {
        key: &'c TensorSource,
        value: &'c TensorSource,
        heads: usize,
        lora: usize,
        nope: usize,
        v: usize,
        width: usize,
    },
}

/// One tensor under its upstream name.
#[derive(Debug, Clone)]
pub(crate) struct Planned<'c> {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub piece: Piece<'c>,
}

/// One expert's projection: its packed MXFP4 values and its E8M0 scales.
#[derive(Debug, Clone)]
pub(crate) struct ExpertPieces<'c> {
    pub packed: Piece<'c>,
    pub scales: Piece<'c>,
}

/// An MoE layer's routed experts, per projection in [`EXPERT_PROJECTIONS`] order.
#[derive(Debug, Clone)]
pub(crate) struct LayerExperts<'c> {
    /// `(rows, cols)` of each projection.
    pub shapes: [(usize, usize); 3],
    /// `[projection][expert]`.
    pub pieces: [Vec<ExpertPieces<'c>>; 3],
}

#[derive(Debug, Clone)]
pub(crate) struct LayerPlan<'c> {
    /// Every non-expert tensor, sorted by name.
    pub deterministic: Vec<Planned<'c>>,
    pub experts: Option<LayerExperts<'c>>,
}

/// The whole checkpoint under upstream names.
#[derive(Debug, Clone)]
pub(crate) struct K3Plan<'c> {
    pub naming: Naming,
    pub embed: &'c TensorSource,
    pub lm_head: &'c TensorSource,
    /// `model.norm`, `output_attn_res` norm and projection weights, in `final.bin` order.
    pub finals: [&'c TensorSource; 3],
    pub layers: Vec<LayerPlan<'c>>,
}

fn refused(what: impl Into<String>, reason: impl Into<String>) -> PackError {
    PackError::Refused {
        what: what.into(),
        reason: reason.into(),
    }
}

fn config_size(object: &Value, at: &str, key: &str) -> Result<usize, PackError> {
    object
        .get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| refused("config.json", format!("{at}.{key} is missing")))
}

fn width_of(dtype: Dtype) -> Option<u64> {
    match dtype {
        Dtype::F32 | Dtype::U32 => Some(4),
        Dtype::BF16 | Dtype::F16 => Some(2),
        Dtype::U8 => Some(1),
        _ => None,
    }
}

/// The bytes of one row of `t` (a 1-D tensor is one row).
fn row_bytes(t: &TensorSource) -> u64 {
    let cols: usize = t.shape.iter().skip(1).product();
    cols as u64 * width_of(t.dtype).unwrap_or(1)
}

/// Tracks which checkpoint tensors the plan has taken.
struct Taker<'c> {
    ckpt: &'c Checkpoint,
    taken: BTreeSet<&'c str>,
}

impl<'c> Taker<'c> {
    fn get(&mut self, name: &str) -> Result<&'c TensorSource, PackError> {
        let (key, t) = self
            .ckpt
            .tensors
            .get_key_value(name)
            .ok_or_else(|| refused(name, "is not in the checkpoint"))?;
        self.taken.insert(key.as_str());
        Ok(t)
    }

    fn has(&self, name: &str) -> bool {
        self.ckpt.tensors.contains_key(name)
    }

    /// The untaken tensors whose names start with `prefix`.
    fn rest(&self, prefix: &str) -> Vec<&'c str> {
        self.ckpt
            .tensors
            .range(prefix.to_string()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, _)| name.as_str())
            .filter(|name| !self.taken.contains(name))
            .collect()
    }
}

fn whole(from: &TensorSource) -> Piece<'_> {
    Piece::Bytes {
        from,
        start: 0,
        len: from.len,
    }
}

fn planned<'c>(name: String, from: &'c TensorSource) -> Planned<'c> {
    Planned {
        name,
        dtype: from.dtype,
        shape: from.shape.clone(),
        piece: whole(from),
    }
}

impl<'c> K3Plan<'c> {
    /// Plans the checkpoint, refusing a tensor the published layout cannot hold or that no
    /// rule takes.
    pub fn new(ckpt: &'c Checkpoint) -> Result<K3Plan<'c>, PackError> {
        let text = ckpt.config.get("text_config").ok_or_else(|| {
            refused(
                "config.json",
                "has no text_config: not a Kimi K3 configuration",
            )
        })?;
        let layers = config_size(text, "text_config", "num_hidden_layers")?;
        let root = match ckpt
            .tensors
            .contains_key("language_model.model.embed_tokens.weight")
        {
            true => "language_model.",
            false => "",
        };
        let layer0 = format!("{root}model.layers.0.");
        let mlx = ckpt.tensors.keys().any(|n| {
            n.starts_with(&layer0)
                && (n.contains("self_attn.qkv_proj.") || n.contains("self_attn.embed_q."))
        });
        let naming = match mlx {
            true => Naming::Mlx,
            false => Naming::Upstream,
        };
        let mut take = Taker {
            ckpt,
            taken: BTreeSet::new(),
        };
        let m = format!("{root}model.");
        let finals = match naming {
            Naming::Upstream => [
                format!("{m}norm.weight"),
                format!("{m}output_attn_res.norm_weight"),
                format!("{m}output_attn_res.proj_weight"),
            ],
            Naming::Mlx => [
                format!("{m}norm.weight"),
                format!("{m}output_attn_res_norm.weight"),
                format!("{m}output_attn_res_proj.weight"),
            ],
        };
        let plan_layer = |layer: usize, take: &mut Taker<'c>| match naming {
            Naming::Upstream => upstream_layer(take, text, root, layer),
            Naming::Mlx => mlx_layer(take, text, root, layer),
        };
        let mut plans = Vec::with_capacity(layers);
        for layer in 0..layers {
            plans.push(plan_layer(layer, &mut take)?);
        }
        let plan = K3Plan {
            naming,
            embed: take.get(&format!("{m}embed_tokens.weight"))?,
            lm_head: take.get(&format!("{root}lm_head.weight"))?,
            finals: [
                take.get(&finals[0])?,
                take.get(&finals[1])?,
                take.get(&finals[2])?,
            ],
            layers: plans,
        };
        if let Some(left) = take.rest("").first() {
            return Err(refused(
                *left,
                "is a tensor no rule of the published layout takes (it holds the text model's layers, embedding, LM head and final norms; a vision tower, MTP layers or a quantized non-expert tensor's scales cannot be written into it)",
            ));
        }
        Ok(plan)
    }
}

/// A layer under the upstream names: every tensor as it is, the routed experts per expert (MLX
/// `weight`/`scales`, or compressed-tensors `weight_packed`/`weight_scale`/`weight_shape`).
fn upstream_layer<'c>(
    take: &mut Taker<'c>,
    text: &Value,
    root: &str,
    layer: usize,
) -> Result<LayerPlan<'c>, PackError> {
    let prefix = format!("{root}model.layers.{layer}.");
    let experts_prefix = format!("{prefix}block_sparse_moe.experts.");
    let experts = match take.has(&format!("{experts_prefix}0.w1.weight"))
        || take.has(&format!("{experts_prefix}0.w1.weight_packed"))
    {
        true => Some(upstream_experts(take, text, &experts_prefix)?),
        false => None,
    };
    let mut deterministic = Vec::new();
    for name in take.rest(&prefix) {
        if !name.starts_with(&experts_prefix) {
            deterministic.push(planned(name.to_string(), take.get(name)?));
        }
    }
    Ok(LayerPlan {
        deterministic,
        experts,
    })
}

fn upstream_experts<'c>(
    take: &mut Taker<'c>,
    text: &Value,
    prefix: &str,
) -> Result<LayerExperts<'c>, PackError> {
    let count = config_size(text, "text_config", "num_experts")?;
    let mut shapes = [(0, 0); 3];
    let mut pieces: [Vec<ExpertPieces<'c>>; 3] = Default::default();
    for (k, (projection, _)) in EXPERT_PROJECTIONS.iter().enumerate() {
        for e in 0..count {
            let name = format!("{prefix}{e}.{projection}");
            let (packed, scales, shape) = match take.has(&format!("{name}.weight_packed")) {
                true => compressed_tensors_expert(take, &name)?,
                false => {
                    let packed = take.get(&format!("{name}.weight"))?;
                    let scales = take.get(&format!("{name}.scales"))?;
                    (packed, scales, mxfp4_shape(&name, packed, scales, &[])?)
                }
            };
            if e > 0 && shape != shapes[k] {
                return Err(refused(name, "has another shape than expert 0's"));
            }
            shapes[k] = shape;
            pieces[k].push(ExpertPieces {
                packed: whole(packed),
                scales: whole(scales),
            });
        }
    }
    if take.has(&format!("{prefix}{count}.w1.weight"))
        || take.has(&format!("{prefix}{count}.w1.weight_packed"))
    {
        return Err(refused(
            format!("{prefix}{count}"),
            format!("is an expert beyond config.json's num_experts = {count}"),
        ));
    }
    Ok(LayerExperts { shapes, pieces })
}

/// An expert in the upstream checkpoint's own storage (compressed-tensors
/// `mxfp4-pack-quantized`): U8 `weight_packed` `[rows, cols/2]`, two E2M1 codes a byte, the
/// earlier column in the low nibble (mlx-lm's `sanitize` views these bytes as MLX's U32 words
/// unchanged), U8 E8M0 `weight_scale` `[rows, cols/32]`, and `weight_shape` `[rows, cols]` when
/// present.
fn compressed_tensors_expert<'c>(
    take: &mut Taker<'c>,
    name: &str,
) -> Result<(&'c TensorSource, &'c TensorSource, (usize, usize)), PackError> {
    let packed = take.get(&format!("{name}.weight_packed"))?;
    let scales = take.get(&format!("{name}.weight_scale"))?;
    let (rows, cols) = match (packed.dtype, packed.shape.as_slice()) {
        (Dtype::U8, [rows, half]) => (*rows, half * 2),
        _ => {
            return Err(refused(
                &packed.name,
                format!(
                    "is {:?} {:?}; compressed-tensors MXFP4 codes are U8 [rows, cols/2]",
                    packed.dtype, packed.shape
                ),
            ));
        }
    };
    if scales.dtype != Dtype::U8 || scales.shape != [rows, cols / 32] || !cols.is_multiple_of(32) {
        return Err(refused(
            &scales.name,
            format!(
                "is {:?} {:?}; the E8M0 scales of {rows} x {cols} codes are U8 [{rows}, {}]",
                scales.dtype,
                scales.shape,
                cols / 32
            ),
        ));
    }
    let shape_name = format!("{name}.weight_shape");
    if take.has(&shape_name) {
        let t = take.get(&shape_name)?;
        let mut buf = Vec::new();
        read_slice_into(&take.ckpt.dir, t, 0, t.len, &mut buf)?;
        let dims: Vec<i64> = match t.dtype {
            Dtype::I64 => buf
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
                .collect(),
            Dtype::I32 => buf
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or_default())))
                .collect(),
            _ => Vec::new(),
        };
        if dims != [rows as i64, cols as i64] {
            return Err(refused(
                &shape_name,
                format!("says {dims:?}; the codes hold {rows} x {cols}"),
            ));
        }
    }
    Ok((packed, scales, (rows, cols)))
}

/// `(rows, cols)` of an MLX MXFP4 matrix (after `lead` stack dimensions): U32 values packing
/// eight 4-bit codes, U8 E8M0 scales per 32 columns, and no affine biases.
fn mxfp4_shape(
    name: &str,
    packed: &TensorSource,
    scales: &TensorSource,
    lead: &[usize],
) -> Result<(usize, usize), PackError> {
    let not = |why: String| {
        refused(
            name,
            format!(
                "is not MLX MXFP4 ({why}): the published layout's expert containers hold MXFP4 experts"
            ),
        )
    };
    let n = lead.len();
    let (p, s) = (&packed.shape, &scales.shape);
    if packed.dtype != Dtype::U32 || scales.dtype != Dtype::U8 {
        return Err(not(format!(
            "values {:?} and scales {:?}; MXFP4 stores U32 and U8",
            packed.dtype, scales.dtype
        )));
    }
    if p.len() != n + 2 || s.len() != n + 2 || p[..n] != *lead || s[..n] != *lead {
        return Err(not(format!("values {p:?} and scales {s:?}")));
    }
    let (rows, cols) = (p[n], p[n + 1] * 8);
    if s[n] != rows || s[n + 1] * 32 != cols {
        return Err(not(format!(
            "scales {s:?} are not one per 32 of {cols} columns"
        )));
    }
    Ok((rows, cols))
}

/// A layer under mlx-lm's names, each tensor mapped back to the upstream one.
fn mlx_layer<'c>(
    take: &mut Taker<'c>,
    text: &Value,
    root: &str,
    layer: usize,
) -> Result<LayerPlan<'c>, PackError> {
    let prefix = format!("{root}model.layers.{layer}.");
    let attn = format!("{prefix}self_attn.");
    let mut out = Vec::new();
    if take.has(&format!("{attn}qkv_proj.weight")) {
        kda_from_mlx(take, text, &attn, &mut out)?;
    }
    if take.has(&format!("{attn}embed_q.weight")) {
        out.push(kv_b_from_mlx(take, &attn)?);
    }
    let mlp = format!("{prefix}mlp.");
    let experts = match take.has(&format!("{mlp}switch_mlp.gate_proj.weight")) {
        true => Some(mlx_experts(take, text, &mlp)?),
        false => None,
    };
    let moe = format!("{prefix}block_sparse_moe.");
    for name in take.rest(&prefix) {
        let t = take.get(name)?;
        let suffix = &name[prefix.len()..];
        let renamed = match suffix.strip_prefix("mlp.") {
            Some("e_score_correction_bias") if experts.is_some() => {
                format!("{moe}gate.e_score_correction_bias")
            }
            Some(rest) if experts.is_some() => format!("{moe}{rest}"),
            _ => format!("{prefix}{}", residual_name(suffix)),
        };
        out.push(planned(renamed, t));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(LayerPlan {
        deterministic: out,
        experts,
    })
}

/// `self_attention_res_proj.weight` -> `self_attention_res.proj_weight` (and the norms, and
/// `mlp_res`); every other name unchanged.
fn residual_name(suffix: &str) -> String {
    for block in ["self_attention_res", "mlp_res"] {
        for kind in ["proj", "norm"] {
            if suffix == format!("{block}_{kind}.weight") {
                return format!("{block}.{kind}_weight");
            }
        }
    }
    suffix.to_string()
}

/// KDA's fused projection and convolution split into q, k and v (row thirds; the convolution
/// `[3P, K, 1]` becomes three F32 `[P, 1, K]`, the same order of values), and `A_log` `[heads]`
/// zero-padded to `head_dim` as the upstream stores it.
fn kda_from_mlx<'c>(
    take: &mut Taker<'c>,
    text: &Value,
    attn: &str,
    out: &mut Vec<Planned<'c>>,
) -> Result<(), PackError> {
    let lin = text
        .get("linear_attn_config")
        .ok_or_else(|| refused("config.json", "text_config.linear_attn_config is missing"))?;
    let at = "text_config.linear_attn_config";
    let (heads, head_dim) = (
        config_size(lin, at, "num_heads")?,
        config_size(lin, at, "head_dim")?,
    );
    let p = heads * head_dim;
    let qkv = take.get(&format!("{attn}qkv_proj.weight"))?;
    let float = |t: &TensorSource| matches!(t.dtype, Dtype::BF16 | Dtype::F32);
    if !float(qkv) || qkv.shape.len() != 2 || qkv.shape[0] != 3 * p {
        return Err(refused(
            &qkv.name,
            format!(
                "is {:?} {:?}; the published layout needs it F32 or BF16 with 3 x {p} rows (a quantized KDA projection cannot be written into it)",
                qkv.dtype, qkv.shape
            ),
        ));
    }
    let third = p as u64 * row_bytes(qkv);
    for (i, part) in ["q", "k", "v"].into_iter().enumerate() {
        out.push(Planned {
            name: format!("{attn}{part}_proj.weight"),
            dtype: qkv.dtype,
            shape: vec![p, qkv.shape[1]],
            piece: Piece::Bytes {
                from: qkv,
                start: i as u64 * third,
                len: third,
            },
        });
    }
    let conv = take.get(&format!("{attn}qkv_conv.conv.weight"))?;
    let kernel = match conv.shape.as_slice() {
        [rows, k, 1] if *rows == 3 * p && float(conv) => *k,
        _ => {
            return Err(refused(
                &conv.name,
                format!(
                    "is {:?} {:?}; expected F32 or BF16 [{}, kernel, 1]",
                    conv.dtype,
                    conv.shape,
                    3 * p
                ),
            ));
        }
    };
    let third = (p * kernel) as u64 * width_of(conv.dtype).unwrap_or(4);
    for (i, part) in ["q", "k", "v"].into_iter().enumerate() {
        let (start, len) = (i as u64 * third, third);
        let piece = match conv.dtype {
            Dtype::BF16 => Piece::Widened {
                from: conv,
                start,
                len,
            },
            _ => Piece::Bytes {
                from: conv,
                start,
                len,
            },
        };
        out.push(Planned {
            name: format!("{attn}{part}_conv1d.weight"),
            dtype: Dtype::F32,
            shape: vec![p, 1, kernel],
            piece,
        });
    }
    let a_log = take.get(&format!("{attn}A_log"))?;
    let w = width_of(a_log.dtype).unwrap_or(0);
    if !float(a_log) || a_log.shape != [heads] || heads > head_dim {
        return Err(refused(
            &a_log.name,
            format!(
                "is {:?} {:?}; expected F32 or BF16 [{heads}] (at most head_dim = {head_dim})",
                a_log.dtype, a_log.shape
            ),
        ));
    }
    out.push(Planned {
        name: format!("{attn}A_log"),
        dtype: a_log.dtype,
        shape: vec![head_dim],
        piece: Piece::Padded {
            from: a_log,
            len: head_dim as u64 * w,
        },
    });
    Ok(())
}

/// MLA's `kv_b_proj` put back together from mlx-lm's `embed_q` and `unembed_out`.
fn kv_b_from_mlx<'c>(take: &mut Taker<'c>, attn: &str) -> Result<Planned<'c>, PackError> {
    let key = take.get(&format!("{attn}embed_q.weight"))?;
    let value = take.get(&format!("{attn}unembed_out.weight"))?;
    let (heads, lora, nope, v) = match (key.shape.as_slice(), value.shape.as_slice()) {
        ([h, l, n], [h2, v, l2]) if h == h2 && l == l2 => (*h, *l, *n, *v),
        _ => {
            return Err(refused(
                &key.name,
                format!(
                    "{:?} and unembed_out {:?} are not [heads, kv_lora, nope] and [heads, v, kv_lora]",
                    key.shape, value.shape
                ),
            ));
        }
    };
    let width = match (key.dtype, value.dtype) {
        (Dtype::BF16, Dtype::BF16) => 2,
        (Dtype::F32, Dtype::F32) => 4,
        (k, v) => {
            return Err(refused(
                &key.name,
                format!(
                    "is {k:?} and unembed_out {v:?}; the published layout needs both F32 or both BF16 (a quantized MLA projection cannot be written into it)"
                ),
            ));
        }
    };
    Ok(Planned {
        name: format!("{attn}kv_b_proj.weight"),
        dtype: key.dtype,
        shape: vec![heads * (nope + v), lora],
        piece: Piece::KvB {
            key,
            value,
            heads,
            lora,
            nope,
            v,
            width,
        },
    })
}

/// mlx-lm's stacked experts `switch_mlp.{gate,up,down}_proj` `[experts, rows, ...]`, one
/// expert's bytes at a time.
fn mlx_experts<'c>(
    take: &mut Taker<'c>,
    text: &Value,
    mlp: &str,
) -> Result<LayerExperts<'c>, PackError> {
    let count = config_size(text, "text_config", "num_experts")?;
    let mut shapes = [(0, 0); 3];
    let mut pieces: [Vec<ExpertPieces<'c>>; 3] = Default::default();
    for (k, (_, mlx)) in EXPERT_PROJECTIONS.iter().enumerate() {
        let name = format!("{mlp}switch_mlp.{mlx}");
        let packed = take.get(&format!("{name}.weight"))?;
        let scales = take.get(&format!("{name}.scales"))?;
        shapes[k] = mxfp4_shape(&name, packed, scales, &[count])?;
        let (p, s) = (packed.len / count as u64, scales.len / count as u64);
        pieces[k] = (0..count as u64)
            .map(|e| ExpertPieces {
                packed: Piece::Bytes {
                    from: packed,
                    start: e * p,
                    len: p,
                },
                scales: Piece::Bytes {
                    from: scales,
                    start: e * s,
                    len: s,
                },
            })
            .collect();
    }
    Ok(LayerExperts { shapes, pieces })
}

impl Piece<'_> {
    /// The bytes, read from the checkpoint at `dir`.
    pub fn read(&self, ckpt: &Checkpoint) -> Result<Vec<u8>, PackError> {
        let mut buf = Vec::new();
        match *self {
            Piece::Bytes { from, start, len } => {
                read_slice_into(&ckpt.dir, from, start, len, &mut buf)?
            }
            Piece::Widened { from, start, len } => {
                read_slice_into(&ckpt.dir, from, start, len, &mut buf)?;
                buf = buf
                    .chunks_exact(2)
                    .flat_map(|b| [0, 0, b[0], b[1]])
                    .collect();
            }
            Piece::Padded { from, len } => {
                read_slice_into(&ckpt.dir, from, 0, from.len, &mut buf)?;
                buf.resize(len as usize, 0);
            }
            Piece::KvB {
                key,
                value,
                heads,
                lora,
                nope,
                v,
                width,
            } => {
                let (mut k, mut val) = (Vec::new(), Vec::new());
                read_slice_into(&ckpt.dir, key, 0, key.len, &mut k)?;
                read_slice_into(&ckpt.dir, value, 0, value.len, &mut val)?;
                buf.reserve(heads * (nope + v) * lora * width);
                for h in 0..heads {
                    let key_head = &k[h * lora * nope * width..][..lora * nope * width];
                    for n in 0..nope {
                        for l in 0..lora {
                            let at = (l * nope + n) * width;
                            buf.extend_from_slice(&key_head[at..at + width]);
                        }
                    }
                    buf.extend_from_slice(&val[h * v * lora * width..][..v * lora * width]);
                }
            }
        }
        Ok(buf)
    }
}
