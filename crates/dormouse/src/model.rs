//! The dormouse model: byte embedding, pre-norm blocks (RMSNorm, causal multi-head attention
//! with RoPE, SwiGLU MLP), Engram memory read at the configured blocks, final RMSNorm, LM head.
//!
//! One forward function serves training and inference: [`Dormouse::forward`] takes a batch of
//! byte windows and an optional [`KvCache`]; with a cache it continues where the cache left off.
//! RMSNorm, RoPE, the causal attention, the SwiGLU gate, the projections and the loss are the
//! fused kernels of [`crate::fused`] (candle's own have no backward pass), each with its
//! backward pass; the matrix products inside them are gemm's, as candle's matmul calls it.
//! Training runs the same kernels in the same order with the backward pass written out
//! ([`Dormouse::loss_and_gradients`]), with the loss and gradients autograd gives this
//! forward (tested): the function that is trained is the function that is served.
//!
//! Tensor names (module paths, stable; the `.dmexp` export and checkpoints use them):
//!
//! | name | shape |
//! |---|---|
//! | `embed.weight` | [256, d_model] |
//! | `engram.order{n}.table` | [engram_rows, engram_dim] per order n |
//! | `blocks.{i}.engram.proj.weight` | [d_model, orders x engram_dim] (blocks in `engram_layers`) |
//! | `blocks.{i}.engram.gate.weight`, `.bias` | [1, d_model], [1] |
//! | `blocks.{i}.attn_norm.weight` | [d_model] |
//! | `blocks.{i}.attn.{q,k,v,o}_proj.weight` | [d_model, d_model] |
//! | `blocks.{i}.mlp_norm.weight` | [d_model] |
//! | `blocks.{i}.mlp.{gate,up}_proj.weight` | [mlp_hidden, d_model] |
//! | `blocks.{i}.mlp.down_proj.weight` | [d_model, mlp_hidden] |
//! | `norm.weight` | [d_model] |
//! | `lm_head.weight` | [256, d_model] (absent when `tie_embeddings`) |

use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Init, Linear, VarBuilder, linear, linear_no_bias};

use std::sync::Arc;

use crate::config::{DormouseConfig, VOCAB_SIZE};
use crate::engram::hash;
use crate::fused::attention::causal_attention;
use crate::fused::linear as fused_linear;
use crate::fused::rms_norm::rms_norm;
use crate::fused::rope::{RopeTables, rope_heads, split_heads};
use crate::fused::swiglu::{swiglu, swiglu_projections};
use crate::row_product;
use crate::step_attention;

mod engram_read_pass;
mod training_pass;
pub use training_pass::LossAndGradients;

/// Standard deviation of the embedding and memory tables at initialisation.
const INIT_STD: f64 = 0.02;

/// RMSNorm: `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(RmsNorm {
            weight: vb.get_with_hints(size, "weight", Init::Const(1.0))?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.weight, self.eps)
    }
}

/// Rotary position embedding tables (rotate-half convention), `[max_seq_len, head_dim / 2]`.
#[derive(Debug, Clone)]
struct Rope {
    tables: Arc<RopeTables>,
    device: Device,
}

impl Rope {
    fn new(cfg: &DormouseConfig, device: &Device) -> Result<Self> {
        let half = cfg.head_dim() / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim() as f64)) as f32)
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, cfg.max_seq_len as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((cfg.max_seq_len, 1))?;
        let angles = positions.broadcast_mul(&inv_freq)?;
        Ok(Rope {
            tables: Arc::new(RopeTables::new(&angles.cos()?, &angles.sin()?)?),
            device: device.clone(),
        })
    }
}

/// Causal multi-head self-attention.
#[derive(Debug, Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    n_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(cfg: &DormouseConfig, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        Ok(Attention {
            q_proj: linear_no_bias(d, d, vb.pp("q_proj"))?,
            k_proj: linear_no_bias(d, d, vb.pp("k_proj"))?,
            v_proj: linear_no_bias(d, d, vb.pp("v_proj"))?,
            o_proj: linear_no_bias(d, d, vb.pp("o_proj"))?,
            n_heads: cfg.n_heads,
            head_dim: cfg.head_dim(),
        })
    }

    fn heads(&self, x: &Tensor, b: usize, t: usize) -> Result<Tensor> {
        x.reshape((b, t, self.n_heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn forward(
        &self,
        x: &Tensor,
        start: usize,
        rope: &Rope,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let q = rope_heads(
            &project(&self.q_proj, x)?,
            &rope.tables,
            self.n_heads,
            start,
        )?;
        let mut k = rope_heads(
            &project(&self.k_proj, x)?,
            &rope.tables,
            self.n_heads,
            start,
        )?;
        let mut v = split_heads(&project(&self.v_proj, x)?, &rope.tables, self.n_heads)?;
        if let Some(cache) = cache {
            // Written in place into buffers that grow by CACHE_GROWTH positions: appending a
            // byte copies that byte's keys and values, not the whole history.
            (k, v) = cache.kv.append(&k.contiguous()?, &v.contiguous()?)?;
        }
        let out = causal_attention(&q, &k, &v, start)?;
        project(&self.o_proj, &out)
    }
}

impl Attention {
    /// One new position per sequence: `x` is `[B, d]`, row `i` continuing `caches[i]` at its own
    /// position. The projections run over all rows at once; RoPE, the cache and the attention
    /// are each row's own ([`step_attention`]).
    fn step(
        &self,
        x: &Tensor,
        rope: &Rope,
        caches: &mut [&mut KvCache],
        layer: usize,
    ) -> Result<Tensor> {
        let d = x.dim(1)?;
        let q = rows_linear(&self.q_proj, x)?.to_vec2::<f32>()?;
        let k = rows_linear(&self.k_proj, x)?.to_vec2::<f32>()?;
        let v = rows_linear(&self.v_proj, x)?;
        let mut outs = Vec::with_capacity(caches.len() * d);
        for (i, ((mut q, mut k), cache)) in q.into_iter().zip(k).zip(caches.iter_mut()).enumerate()
        {
            let position = cache.position;
            rope.tables.rotate(&mut q, position)?;
            rope.tables.rotate(&mut k, position)?;
            let k = self.heads(&Tensor::from_vec(k, (1, d), x.device())?, 1, 1)?;
            let v = self.heads(&v.narrow(0, i, 1)?, 1, 1)?;
            let (keys, values) = cache.layers[layer].kv.append(&k, &v)?;
            outs.extend(step_attention::attend(&q, &keys, &values, self.head_dim)?);
        }
        let outs = Tensor::from_vec(outs, (caches.len(), d), x.device())?;
        rows_linear(&self.o_proj, &outs)
    }
}

/// `x [.., in] -> [.., out]`: the fused [`fused_linear::linear`] without a bias, candle's with one.
fn project(layer: &Linear, x: &Tensor) -> Result<Tensor> {
    match layer.bias() {
        None => fused_linear::linear(x, layer.weight()),
        Some(_) => layer.forward(x),
    }
}

/// `x [B, in] -> [B, out]` through [`row_product`], whose every row's bits are independent of
/// B and of the other rows.
fn rows_linear(linear: &Linear, x: &Tensor) -> Result<Tensor> {
    row_product::rows_times_transposed(x, linear.weight(), linear.bias())
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn new(cfg: &DormouseConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Mlp {
            gate_proj: linear_no_bias(cfg.d_model, cfg.mlp_hidden, vb.pp("gate_proj"))?,
            up_proj: linear_no_bias(cfg.d_model, cfg.mlp_hidden, vb.pp("up_proj"))?,
            down_proj: linear_no_bias(cfg.mlp_hidden, cfg.d_model, vb.pp("down_proj"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gated = swiglu_projections(x, self.gate_proj.weight(), self.up_proj.weight())?;
        project(&self.down_proj, &gated)
    }
}

/// Where a block reads the memory: projection of the gathered rows and a gate computed from
/// the hidden state.
#[derive(Debug, Clone)]
struct EngramRead {
    proj: Linear,
    gate: Linear,
}

impl EngramRead {
    fn new(cfg: &DormouseConfig, vb: VarBuilder) -> Result<Self> {
        let width = cfg.engram_orders.len() * cfg.engram_dim;
        Ok(EngramRead {
            proj: linear_no_bias(width, cfg.d_model, vb.pp("proj"))?,
            gate: linear(cfg.d_model, 1, vb.pp("gate"))?,
        })
    }

    /// `h + sigmoid(gate(h)) * proj(memory)`.
    fn forward(&self, h: &Tensor, memory: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::sigmoid(&self.gate.forward(h)?)?;
        h + project(&self.proj, memory)?.broadcast_mul(&gate)?
    }
}

#[derive(Debug, Clone)]
struct Block {
    engram: Option<EngramRead>,
    attn_norm: RmsNorm,
    attn: Attention,
    mlp_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    fn new(cfg: &DormouseConfig, index: usize, vb: VarBuilder) -> Result<Self> {
        let reads = cfg.use_engram && cfg.engram_layers.contains(&index);
        Ok(Block {
            engram: if reads {
                Some(EngramRead::new(cfg, vb.pp("engram"))?)
            } else {
                None
            },
            attn_norm: RmsNorm::new(cfg.d_model, cfg.norm_eps, vb.pp("attn_norm"))?,
            attn: Attention::new(cfg, vb.pp("attn"))?,
            mlp_norm: RmsNorm::new(cfg.d_model, cfg.norm_eps, vb.pp("mlp_norm"))?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
        })
    }

    fn forward(
        &self,
        h: &Tensor,
        memory: Option<&Tensor>,
        start: usize,
        rope: &Rope,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let h = match (&self.engram, memory) {
            (Some(read), Some(memory)) => read.forward(h, memory)?,
            _ => h.clone(),
        };
        let h = (&h
            + self
                .attn
                .forward(&self.attn_norm.forward(&h)?, start, rope, cache)?)?;
        &h + self.mlp.forward(&self.mlp_norm.forward(&h)?)?
    }
}

impl Block {
    /// [`Block::forward`] for one new position per sequence, `h` `[B, d]` (see [`Dormouse::step`]).
    fn step(
        &self,
        h: &Tensor,
        memory: Option<&Tensor>,
        rope: &Rope,
        caches: &mut [&mut KvCache],
        layer: usize,
    ) -> Result<Tensor> {
        let h = match (&self.engram, memory) {
            (Some(read), Some(memory)) => read.step(h, memory)?,
            _ => h.clone(),
        };
        let attended = self
            .attn
            .step(&self.attn_norm.forward(&h)?, rope, caches, layer)?;
        let h = (&h + attended)?;
        &h + self.mlp.step(&self.mlp_norm.forward(&h)?)?
    }
}

impl Mlp {
    fn step(&self, x: &Tensor) -> Result<Tensor> {
        let gated = swiglu(
            &rows_linear(&self.gate_proj, x)?,
            &rows_linear(&self.up_proj, x)?,
        )?;
        rows_linear(&self.down_proj, &gated)
    }
}

impl EngramRead {
    fn step(&self, h: &Tensor, memory: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::sigmoid(&rows_linear(&self.gate, h)?)?;
        h + rows_linear(&self.proj, memory)?.broadcast_mul(&gate)?
    }
}

/// The keys and values one block has seen, along the sequence axis (2) of `[B, H, S, Dh]`.
#[derive(Debug)]
struct LayerCache {
    kv: candle_nn::kv_cache::KvCache,
}

/// Positions a layer's cache buffers grow by. A cache sized for `max_seq_len` at once costs
/// every request megabytes of freshly zeroed memory however short it is; growing in steps
/// costs a copy of the buffer per step instead (a few per `max_seq_len`).
const CACHE_GROWTH: usize = 64;

/// Incremental-decoding state: per-block keys and values, the position reached, and the last
/// bytes of each sequence (the Engram n-grams of new bytes reach back into them). Not `Clone`:
/// its buffers are written in place, so a copy would share them.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    position: usize,
    recent: Vec<Vec<u8>>,
}

impl KvCache {
    pub fn new(cfg: &DormouseConfig) -> Self {
        KvCache {
            layers: (0..cfg.n_layers)
                .map(|_| LayerCache {
                    kv: candle_nn::kv_cache::KvCache::new(2, CACHE_GROWTH.min(cfg.max_seq_len)),
                })
                .collect(),
            position: 0,
            recent: Vec::new(),
        }
    }

    /// Bytes consumed so far (the absolute position of the next byte).
    pub fn position(&self) -> usize {
        self.position
    }
}

/// The model.
#[derive(Debug, Clone)]
pub struct Dormouse {
    cfg: DormouseConfig,
    embed: Embedding,
    tables: Vec<Tensor>,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    rope: Rope,
}

impl Dormouse {
    /// Builds the model from `cfg`, taking every tensor from `vb` by its module path.
    pub fn new(cfg: &DormouseConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::wrap)?;
        let embed_w = vb.pp("embed").get_with_hints(
            (VOCAB_SIZE, cfg.d_model),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: INIT_STD,
            },
        )?;
        let tables = if cfg.use_engram {
            cfg.engram_orders
                .iter()
                .map(|n| {
                    vb.pp("engram").pp(format!("order{n}")).get_with_hints(
                        (cfg.engram_rows, cfg.engram_dim),
                        "table",
                        Init::Randn {
                            mean: 0.0,
                            stdev: INIT_STD,
                        },
                    )
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let blocks = (0..cfg.n_layers)
            .map(|i| Block::new(cfg, i, vb.pp("blocks").pp(i)))
            .collect::<Result<_>>()?;
        let lm_head = if cfg.tie_embeddings {
            None
        } else {
            Some(linear_no_bias(cfg.d_model, VOCAB_SIZE, vb.pp("lm_head"))?)
        };
        Ok(Dormouse {
            cfg: cfg.clone(),
            embed: Embedding::new(embed_w, cfg.d_model),
            tables,
            blocks,
            norm: RmsNorm::new(cfg.d_model, cfg.norm_eps, vb.pp("norm"))?,
            lm_head,
            rope: Rope::new(cfg, vb.device())?,
        })
    }

    pub fn config(&self) -> &DormouseConfig {
        &self.cfg
    }

    /// Where the model's tensors live.
    pub fn device(&self) -> &Device {
        &self.rope.device
    }

    /// Logits `[B, T, 256]` for a batch of equally long byte windows. Without a cache the
    /// windows start at position 0 with nothing before them; with a cache they continue the
    /// sequences the cache holds (and the cache is extended).
    pub fn forward(&self, windows: &[&[u8]], cache: Option<&mut KvCache>) -> Result<Tensor> {
        self.runs_on_its_own()?;
        self.run(windows, cache, None)
    }

    fn runs_on_its_own(&self) -> Result<()> {
        if self.cfg.engram_ram {
            candle_core::bail!(
                "this model was trained with --engram-ram: its memory rows live in the run's .ngram \
                 sidecar, not in the model (engram_rows is 1 per order), so it cannot be run on its own"
            );
        }
        Ok(())
    }

    /// The same function as [`Dormouse::forward`] (no cache) with the memory rows gathered by
    /// the caller, `[B, T, orders x engram_dim]`: how an `--engram-ram` run, whose rows live in
    /// host RAM, trains and evaluates.
    pub fn forward_with_memory(&self, windows: &[&[u8]], memory: &Tensor) -> Result<Tensor> {
        if !self.cfg.use_engram {
            candle_core::bail!("this model has no Engram memory to read");
        }
        self.run(windows, None, Some(memory.clone()))
    }

    fn run(
        &self,
        windows: &[&[u8]],
        mut cache: Option<&mut KvCache>,
        memory: Option<Tensor>,
    ) -> Result<Tensor> {
        let device = self.rope.device.clone();
        let start = cache.as_ref().map_or(0, |c| c.position);
        let (b, t) = self.window_shape(windows, start)?;
        let ids: Vec<u32> = windows
            .iter()
            .flat_map(|w| w.iter().map(|&x| u32::from(x)))
            .collect();
        let mut h = self
            .embed
            .forward(&Tensor::from_vec(ids, (b, t), &device)?)?;
        let memory = match memory {
            Some(m) => Some(m),
            None => self.read_memory(windows, cache.as_deref(), &device)?,
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let layer = cache.as_deref_mut().and_then(|c| c.layers.get_mut(i));
            h = block.forward(&h, memory.as_ref(), start, &self.rope, layer)?;
        }
        if let Some(c) = cache {
            c.position += t;
            c.remember(windows, self.max_order());
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => project(head, &h),
            // As a Linear over the embedding: the product reads the matrix transposed in place
            // instead of copying it per call.
            None => fused_linear::linear(&h, self.embed.embeddings()),
        }
    }

    /// `(B, T)` of B equally long windows of T bytes continuing from position `start`,
    /// refusing an empty batch, ragged windows and windows that end past `max_seq_len`.
    fn window_shape(&self, windows: &[&[u8]], start: usize) -> Result<(usize, usize)> {
        let (b, t) = (windows.len(), windows.first().map_or(0, |w| w.len()));
        if b == 0 || t == 0 || windows.iter().any(|w| w.len() != t) {
            candle_core::bail!(
                "forward needs at least one window, all of the same non-zero length"
            );
        }
        if start + t > self.cfg.max_seq_len {
            candle_core::bail!(
                "position {} is past max_seq_len {}",
                start + t,
                self.cfg.max_seq_len
            );
        }
        Ok((b, t))
    }

    /// Logits `[B, 256]` for one more byte in each of B sequences, `bytes[i]` continuing
    /// `caches[i]` (a cache of one sequence, at any position; the caches are extended). This is
    /// how decoding runs, alone or batched: every weight is read once for all rows, and each
    /// row gets the same bits whatever B is and whichever sequences run beside it.
    pub fn step(&self, bytes: &[u8], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        self.check_step(bytes, caches)?;
        let device = self.rope.device.clone();
        let ids: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        let mut h = self
            .embed
            .forward(&Tensor::from_vec(ids, bytes.len(), &device)?)?;
        let memory = self.step_memory(bytes, caches, &device)?;
        for (i, block) in self.blocks.iter().enumerate() {
            h = block.step(&h, memory.as_ref(), &self.rope, caches, i)?;
        }
        for (cache, &byte) in caches.iter_mut().zip(bytes) {
            cache.position += 1;
            cache.remember(&[&[byte]], self.max_order());
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => rows_linear(head, &h),
            None => rows_linear(&Linear::new(self.embed.embeddings().clone(), None), &h),
        }
    }

    fn check_step(&self, bytes: &[u8], caches: &[&mut KvCache]) -> Result<()> {
        self.runs_on_its_own()?;
        if bytes.is_empty() || bytes.len() != caches.len() {
            candle_core::bail!(
                "a step needs one byte per cache, at least one ({} bytes, {} caches)",
                bytes.len(),
                caches.len()
            );
        }
        for cache in caches {
            if cache.recent.len() > 1 {
                candle_core::bail!(
                    "a step continues caches of one sequence each; this one holds {}",
                    cache.recent.len()
                );
            }
            if cache.position >= self.cfg.max_seq_len {
                candle_core::bail!(
                    "position {} is past max_seq_len {}",
                    cache.position + 1,
                    self.cfg.max_seq_len
                );
            }
        }
        Ok(())
    }

    /// The memory rows `[B, orders x engram_dim]` of one new byte per sequence, each hashed
    /// after its own sequence's recent bytes.
    fn step_memory(
        &self,
        bytes: &[u8],
        caches: &[&mut KvCache],
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let sequences = caches
            .iter()
            .zip(bytes.chunks(1))
            .map(|(cache, byte)| (cache.recent.first().map_or(&[][..], Vec::as_slice), byte));
        self.gather_memory(sequences, device)?
            .map(|m| m.squeeze(1))
            .transpose()
    }

    fn max_order(&self) -> usize {
        self.cfg.engram_orders.iter().copied().max().unwrap_or(1)
    }

    /// The gathered memory rows `[B, T, orders x engram_dim]`, or `None` without Engram.
    fn read_memory(
        &self,
        windows: &[&[u8]],
        cache: Option<&KvCache>,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let histories = (0..windows.len()).map(|s| {
            cache
                .and_then(|c| c.recent.get(s))
                .map_or(&[][..], Vec::as_slice)
        });
        self.gather_memory(histories.zip(windows.iter().copied()), device)
    }

    /// The memory rows `[B, T, orders x engram_dim]` of B equally long windows, each hashed
    /// after its own history (the bytes before it), one gather per order for all of them.
    fn gather_memory<'w>(
        &self,
        sequences: impl ExactSizeIterator<Item = (&'w [u8], &'w [u8])>,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        if self.tables.is_empty() {
            return Ok(None);
        }
        let read = self.memory_rows(sequences);
        Ok(Some(self.gather(&read, &self.tables, device)?))
    }

    /// Which row of each order's table every position of B equally long windows reads, each
    /// window hashed after its own history.
    fn memory_rows<'w>(
        &self,
        sequences: impl ExactSizeIterator<Item = (&'w [u8], &'w [u8])>,
    ) -> MemoryRows {
        let b = sequences.len();
        let mut t = 0;
        let mut per_order: Vec<Vec<u32>> = vec![Vec::new(); self.cfg.engram_orders.len()];
        for (history, window) in sequences {
            t = window.len();
            let rows = hash::rows_for(
                history,
                window,
                &self.cfg.engram_orders,
                self.cfg.engram_rows,
            );
            for (all, order_rows) in per_order.iter_mut().zip(rows) {
                all.extend(order_rows);
            }
        }
        MemoryRows { b, t, per_order }
    }

    /// The rows `read` names, gathered from `tables` (one per order) as `[B, T, orders x
    /// engram_dim]`.
    fn gather(&self, read: &MemoryRows, tables: &[Tensor], device: &Device) -> Result<Tensor> {
        let gathered = read
            .per_order
            .iter()
            .zip(tables)
            .map(|(rows, table)| {
                let index = Tensor::from_vec(rows.clone(), read.b * read.t, device)?;
                table
                    .index_select(&index, 0)?
                    .reshape((read.b, read.t, self.cfg.engram_dim))
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&gathered, D::Minus1)
    }
}

/// The table rows a batch's positions read: `per_order[o][i]` for position `i` (window after
/// window) in order `o`'s table.
struct MemoryRows {
    b: usize,
    t: usize,
    per_order: Vec<Vec<u32>>,
}

impl KvCache {
    /// Keeps the last `max_order - 1` bytes of each sequence for the next n-grams.
    fn remember(&mut self, windows: &[&[u8]], max_order: usize) {
        self.recent.resize(windows.len(), Vec::new());
        let keep = max_order.saturating_sub(1);
        for (recent, window) in self.recent.iter_mut().zip(windows) {
            recent.extend_from_slice(window);
            let drop = recent.len().saturating_sub(keep);
            recent.drain(..drop);
        }
    }
}
