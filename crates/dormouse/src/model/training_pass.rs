//! A training batch's loss and every parameter's gradient, with the model's backward pass
//! written out instead of left to candle's autograd.
//!
//! candle's backward pass gives every input of every node a freshly zeroed buffer and adds
//! the node's gradient into it, one element-wise pass after another on the calling thread.
//! For `small` at batch 8 x 256 that was about a fifth of a step, with the second core idle.
//! Here the forward pass runs the same kernels in the same order as [`Dormouse::forward`] on
//! detached tensors and keeps each fused op with its inputs ([`crate::fused::applied`]); the
//! backward pass calls each op's own backward pass in reverse order, hands each gradient on
//! as it is, and adds the residual stream's gradients in place. The Engram read
//! ([`super::engram_read_pass`]) and the gathers (the embedding's and the memory tables'
//! rows, added back position after position) are written out the way autograd computes them.
//!
//! The attention's normed input has three gradients (from the query, key and value
//! projections), added in the order autograd adds them; every other tensor has at most two
//! (the residual stream: the next block and the norm; the tied embedding: the head, then the
//! lookup's rows added onto it), so every gradient has the bits candle's autograd gives it.
//! A test holds the two to equality.

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

use super::engram_read_pass::{self, EngramTape};
use super::{Block, Dormouse, MemoryRows};
use crate::config::VOCAB_SIZE;
use crate::fused::applied::{Applied1, Applied2, Applied3};
use crate::fused::attention::attention_op;
use crate::fused::cross_entropy::cross_entropy_op;
use crate::fused::in_place::update_with;
use crate::fused::linear::linear_op;
use crate::fused::rms_norm::rms_norm_op;
use crate::fused::rope::heads_op;
use crate::fused::swiglu::swiglu_projections_op;
use crate::fused::{sum, with_f32, zeros};

/// A batch's loss (mean nats per predicted byte) and the gradient of every parameter it
/// reached, keyed by the parameters' tensors (and, on an `--engram-ram` run, the host rows').
pub struct LossAndGradients {
    pub loss: Tensor,
    pub grads: GradStore,
}

struct AttentionTape {
    norm: Applied2,
    q: Applied2,
    k: Applied2,
    v: Applied2,
    q_heads: Applied1,
    k_heads: Applied1,
    v_heads: Applied1,
    attend: Applied3,
    out: Applied2,
}

struct MlpTape {
    norm: Applied2,
    gated: Applied3,
    down: Applied2,
}

struct BlockTape {
    engram: Option<EngramTape>,
    attn: AttentionTape,
    mlp: MlpTape,
}

/// `dst += src`, element by element in place (`dst` is a gradient this pass owns).
fn add_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    update_with("a gradient sum", dst, src, |d, s| *d += s)
}

/// Where a batch's memory rows come from, and which table rows it read.
enum MemorySource<'a> {
    Absent,
    Host(&'a Var),
    Tables(MemoryRows),
}

/// What the forward pass keeps for the backward pass.
struct Kept<'a> {
    ids: Tensor,
    rows: usize,
    memory: MemorySource<'a>,
    blocks: Vec<BlockTape>,
    norm: Applied2,
    logits: Applied2,
    loss: Applied1,
}

impl Dormouse {
    /// The loss of predicting `targets` (one per input byte, in order) from the byte
    /// windows `inputs`, and its gradients: the value [`crate::train::batch_loss`] gives and
    /// the gradients its autograd backward pass gives, with the same bits. `host_memory` is
    /// an `--engram-ram` run's gathered rows `[B, T, orders x engram_dim]`.
    pub fn loss_and_gradients(
        &self,
        inputs: &[&[u8]],
        targets: Vec<u32>,
        host_memory: Option<&Var>,
    ) -> Result<LossAndGradients> {
        match host_memory {
            None => self.runs_on_its_own()?,
            Some(_) if !self.cfg.use_engram => {
                candle_core::bail!("this model has no Engram memory to read")
            }
            Some(_) => {}
        }
        let kept = self.forward_kept(inputs, targets, host_memory)?;
        let loss = kept.loss.output().clone();
        let grads = self.backward_kept(kept)?;
        Ok(LossAndGradients { loss, grads })
    }

    /// [`Dormouse::forward`] from position 0 without a cache, then the loss, keeping what the
    /// backward pass reads.
    fn forward_kept<'a>(
        &self,
        inputs: &[&[u8]],
        targets: Vec<u32>,
        host_memory: Option<&'a Var>,
    ) -> Result<Kept<'a>> {
        let device = self.rope.device.clone();
        let (b, t) = self.window_shape(inputs, 0)?;
        let ids: Vec<u32> = inputs
            .iter()
            .flat_map(|w| w.iter().map(|&x| u32::from(x)))
            .collect();
        let ids = Tensor::from_vec(ids, b * t, &device)?;
        let embedded = self
            .embed
            .embeddings()
            .detach()
            .index_select(&ids, 0)?
            .reshape((b, t, self.cfg.d_model))?;
        let (memory_rows, memory) = match host_memory {
            Some(rows) => (Some(rows.as_tensor().detach()), MemorySource::Host(rows)),
            None if self.tables.is_empty() => (None, MemorySource::Absent),
            None => {
                let read = self.memory_rows(inputs.iter().map(|w| (&[][..], *w)));
                let tables: Vec<Tensor> = self.tables.iter().map(Tensor::detach).collect();
                let rows = self.gather(&read, &tables, &device)?;
                (Some(rows), MemorySource::Tables(read))
            }
        };
        let mut h = embedded;
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (next, tape) = self.block_forward(block, &h, memory_rows.as_ref())?;
            h = next;
            blocks.push(tape);
        }
        let norm_weight = self.norm.weight.detach();
        let norm = Applied2::new(rms_norm_op(self.cfg.norm_eps), &h, &norm_weight)?;
        let logits = Applied2::new(linear_op(), norm.output(), &self.head_weight().detach())?;
        let flat = logits.output().reshape((b * t, VOCAB_SIZE))?;
        let loss = Applied1::new(cross_entropy_op(&flat, targets)?, &flat)?;
        Ok(Kept {
            ids,
            rows: b * t,
            memory,
            blocks,
            norm,
            logits,
            loss,
        })
    }

    /// Every parameter's gradient (and the host rows') from what the forward pass kept.
    fn backward_kept(&self, kept: Kept<'_>) -> Result<GradStore> {
        let mut grads = GradStore::default();
        let seed = Tensor::ones((), DType::F32, self.device())?;
        let d_logits = kept
            .loss
            .grad(&seed)?
            .reshape(kept.logits.output().shape())?;
        let (d_normed, d_head) = kept.logits.grads(&d_logits)?;
        grads.insert(self.head_weight(), d_head);
        let (mut dh, d_norm) = kept.norm.grads(&d_normed)?;
        grads.insert(&self.norm.weight, d_norm);
        let mut d_memory: Option<Tensor> = None;
        for (block, tape) in self.blocks.iter().zip(kept.blocks).rev() {
            dh = block_backward(block, tape, dh, &mut d_memory, &mut grads)?;
        }
        // The lookup's rows are added into the head's gradient when the two are tied, as
        // autograd adds them (row by row onto what is there: not the same as adding two sums).
        let embed = self.embed.embeddings();
        let base = match grads.remove(embed) {
            Some(d_head) => d_head,
            None => embed.zeros_like()?,
        };
        let rows = dh.reshape((kept.rows, self.cfg.d_model))?;
        grads.insert(embed, base.index_add(&kept.ids, &rows, 0)?);
        match (d_memory, &kept.memory) {
            (Some(d_memory), MemorySource::Host(rows)) => {
                grads.insert(rows.as_tensor(), d_memory);
            }
            (Some(d_memory), MemorySource::Tables(read)) => {
                for (order, table) in self.tables.iter().enumerate() {
                    let grad = self.table_grad(read, order, &d_memory)?;
                    grads.insert(table, grad);
                }
            }
            _ => {}
        }
        Ok(grads)
    }

    /// The gradient of order `order`'s table: the gradient of each position's memory row
    /// (its band of `d_memory`) added to the table row it read, position after position, onto
    /// zeros (as autograd's `index_add` does).
    fn table_grad(&self, read: &MemoryRows, order: usize, d_memory: &Tensor) -> Result<Tensor> {
        let dim = self.cfg.engram_dim;
        let width = read.per_order.len() * dim;
        let mut grad = zeros(self.cfg.engram_rows * dim);
        with_f32(
            "a memory table's gradient",
            &d_memory.contiguous()?,
            |d_memory| {
                let positions = d_memory.chunks(width).zip(&read.per_order[order]);
                for (position, &row) in positions {
                    let row = row as usize;
                    let (Some(dst), Some(src)) = (
                        grad.get_mut(row * dim..(row + 1) * dim),
                        position.get(order * dim..(order + 1) * dim),
                    ) else {
                        candle_core::bail!(
                            "memory row {row} is past the table's {} rows",
                            self.cfg.engram_rows
                        );
                    };
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d += s;
                    }
                }
                Ok(())
            },
        )?;
        Tensor::from_vec(grad, (self.cfg.engram_rows, dim), d_memory.device())
    }

    /// The LM head's matrix: its own, or the embedding's when tied.
    fn head_weight(&self) -> &Tensor {
        match &self.lm_head {
            Some(head) => head.weight(),
            None => self.embed.embeddings(),
        }
    }

    /// [`Block::forward`] from position 0 without a cache, keeping what the backward pass
    /// reads.
    fn block_forward(
        &self,
        block: &Block,
        h: &Tensor,
        memory: Option<&Tensor>,
    ) -> Result<(Tensor, BlockTape)> {
        let (h, engram) = match (&block.engram, memory) {
            (Some(read), Some(memory)) => {
                let (h, tape) = engram_read_pass::forward(read, h, memory)?;
                (h, Some(tape))
            }
            _ => (h.clone(), None),
        };
        let attn = self.attention_forward(block, &h)?;
        let h = sum(&h, attn.out.output())?;
        let mlp = mlp_forward(block, &h, self.cfg.norm_eps)?;
        let h = sum(&h, mlp.down.output())?;
        Ok((h, BlockTape { engram, attn, mlp }))
    }

    fn attention_forward(&self, block: &Block, h: &Tensor) -> Result<AttentionTape> {
        let attn = &block.attn;
        let norm = Applied2::new(
            rms_norm_op(self.cfg.norm_eps),
            h,
            &block.attn_norm.weight.detach(),
        )?;
        let project = |w: &Tensor| Applied2::new(linear_op(), norm.output(), &w.detach());
        let (q, k, v) = (
            project(attn.q_proj.weight())?,
            project(attn.k_proj.weight())?,
            project(attn.v_proj.weight())?,
        );
        let tables = &self.rope.tables;
        let q_heads = Applied1::new(heads_op(tables, attn.n_heads, true), q.output())?;
        let k_heads = Applied1::new(heads_op(tables, attn.n_heads, true), k.output())?;
        let v_heads = Applied1::new(heads_op(tables, attn.n_heads, false), v.output())?;
        let attend = Applied3::new(
            attention_op(attn.head_dim),
            q_heads.output(),
            k_heads.output(),
            v_heads.output(),
        )?;
        let out = Applied2::new(linear_op(), attend.output(), &attn.o_proj.weight().detach())?;
        Ok(AttentionTape {
            norm,
            q,
            k,
            v,
            q_heads,
            k_heads,
            v_heads,
            attend,
            out,
        })
    }
}

fn mlp_forward(block: &Block, h: &Tensor, eps: f64) -> Result<MlpTape> {
    let mlp = &block.mlp;
    let norm = Applied2::new(rms_norm_op(eps), h, &block.mlp_norm.weight.detach())?;
    let gated = Applied3::new(
        swiglu_projections_op(),
        norm.output(),
        &mlp.gate_proj.weight().detach(),
        &mlp.up_proj.weight().detach(),
    )?;
    let down = Applied2::new(
        linear_op(),
        gated.output(),
        &mlp.down_proj.weight().detach(),
    )?;
    Ok(MlpTape { norm, gated, down })
}

/// The gradient of a block's input from its output's `dh` (which it takes over and adds
/// into), the block's parameter gradients into `grads` and its memory rows' gradient into
/// `d_memory`.
fn block_backward(
    block: &Block,
    tape: BlockTape,
    dh: Tensor,
    d_memory: &mut Option<Tensor>,
    grads: &mut GradStore,
) -> Result<Tensor> {
    let BlockTape { engram, attn, mlp } = tape;
    let (d_gated, d_down) = mlp.down.grads(&dh)?;
    let (d_normed, d_gate, d_up) = mlp.gated.grads(&d_gated)?;
    let (d_residual, d_norm) = mlp.norm.grads(&d_normed)?;
    add_into(&dh, &d_residual)?;
    grads.insert(block.mlp.down_proj.weight(), d_down);
    grads.insert(block.mlp.gate_proj.weight(), d_gate);
    grads.insert(block.mlp.up_proj.weight(), d_up);
    grads.insert(&block.mlp_norm.weight, d_norm);

    let (d_attended, d_o) = attn.out.grads(&dh)?;
    let (dq, dk, dv) = attn.attend.grads(&d_attended)?;
    let (dq, dk, dv) = (
        attn.q_heads.grad(&dq)?,
        attn.k_heads.grad(&dk)?,
        attn.v_heads.grad(&dv)?,
    );
    // In the order autograd adds them (it visits the values' projection first): the sum of
    // three is not commutative.
    let (d_normed, d_v) = attn.v.grads(&dv)?;
    let (from_k, d_k) = attn.k.grads(&dk)?;
    let (from_q, d_q) = attn.q.grads(&dq)?;
    add_into(&d_normed, &from_k)?;
    add_into(&d_normed, &from_q)?;
    let (d_residual, d_norm) = attn.norm.grads(&d_normed)?;
    add_into(&dh, &d_residual)?;
    let a = &block.attn;
    grads.insert(a.o_proj.weight(), d_o);
    grads.insert(a.q_proj.weight(), d_q);
    grads.insert(a.k_proj.weight(), d_k);
    grads.insert(a.v_proj.weight(), d_v);
    grads.insert(&block.attn_norm.weight, d_norm);

    let Some(engram) = engram else {
        return Ok(dh);
    };
    let Some(read) = &block.engram else {
        candle_core::bail!("a block without an Engram read kept one's forward pass");
    };
    let (d_input, d_rows) = engram_read_pass::backward(read, engram, &dh, grads)?;
    *d_memory = Some(match d_memory.take() {
        Some(earlier) => (earlier + d_rows)?,
        None => d_rows,
    });
    Ok(d_input)
}
