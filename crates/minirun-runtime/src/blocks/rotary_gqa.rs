//! Grouped-query attention as Llama, Qwen3 and Qwen3-MoE compute it: q, k and v projections,
//! each query and key head RMS-normed where the architecture has per-head norms (Qwen3's
//! `q_norm`, `k_norm`) and rotated over its two halves for its position, query head `h` over
//! key/value head `h / (heads / kv_heads)`, the heads side by side through `o_proj`.

use minirun_stream::artifact::ArtifactError;
use minirun_stream::matrix::Matrix;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

use crate::blocks::grouped_attention::{GroupedDims, KvCache, attend_head};
use crate::blocks::norm::rms_norm;
use crate::blocks::products::apply_batch;
use crate::blocks::rope::Rope;
use crate::engine::decode_policy::{Rows, SequenceCache};

/// One layer's attention weights (under `self_attn`).
pub struct RotaryGqa<'a> {
    q: Matrix<'a>,
    k: Matrix<'a>,
    v: Matrix<'a>,
    o: Matrix<'a>,
    /// The per-head query and key norms, where the architecture has them.
    qk_norms: Option<(Vec<f32>, Vec<f32>)>,
}

/// What every layer's attention shares: the sizes, the rotation, the norms' epsilon and the
/// softmax scale `head_dim^-1/2`.
pub(crate) struct RotaryGqaShape {
    dims: GroupedDims,
    rope: Rope,
    eps: f32,
    scale: f32,
}

impl RotaryGqaShape {
    pub(crate) fn new(dims: GroupedDims, rope: Rope, eps: f32) -> RotaryGqaShape {
        RotaryGqaShape {
            dims,
            rope,
            eps,
            scale: (dims.head_dim as f64).powf(-0.5) as f32,
        }
    }
}

impl<'a> RotaryGqa<'a> {
    /// `q_proj`, `k_proj`, `v_proj`, `o_proj` under `w` (and `q_norm`, `k_norm` where
    /// `qk_norm`), for a model of width `hidden`.
    pub(crate) fn new(
        w: &Weights<'a>,
        hidden: usize,
        d: GroupedDims,
        qk_norm: bool,
    ) -> Result<RotaryGqa<'a>, ArtifactError> {
        let (q_rows, kv_rows) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        Ok(RotaryGqa {
            q: w.matrix("q_proj", q_rows, hidden)?,
            k: w.matrix("k_proj", kv_rows, hidden)?,
            v: w.matrix("v_proj", kv_rows, hidden)?,
            o: w.matrix("o_proj", hidden, q_rows)?,
            qk_norms: match qk_norm {
                true => Some((
                    w.vector("q_norm.weight", d.head_dim)?,
                    w.vector("k_norm.weight", d.head_dim)?,
                )),
                false => None,
            },
        })
    }

    /// Attention for a batch of rows: every row's keys and values go into its cache first, then
    /// each row's heads attend to its cache up to its own position.
    pub(crate) fn attend(
        &self,
        s: &RotaryGqaShape,
        xs: &[Vec<f32>],
        (layer, rows): (usize, &Rows),
        caches: &mut [&mut SequenceCache<KvCache>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let qs = apply_batch(&self.q, xs, stats)?;
        let ks = apply_batch(&self.k, xs, stats)?;
        let vs = apply_batch(&self.v, xs, stats)?;
        let k_norm = self.qk_norms.as_ref().map(|(_, k)| k.as_slice());
        for (t, (k, v)) in ks.iter().zip(&vs).enumerate() {
            let k = heads_rotated(s, k, k_norm, rows.position[t]);
            caches[rows.cache[t]].layers[layer].push(&k, v);
        }
        let mixed = self.mix_all_heads(s, &qs, layer, rows, caches);
        apply_batch(&self.o, &mixed, stats)
    }

    /// Every row's heads, each row on whichever worker takes it: rows are independent, so each
    /// has the bits it has alone.
    fn mix_all_heads(
        &self,
        s: &RotaryGqaShape,
        qs: &[Vec<f32>],
        layer: usize,
        rows: &Rows,
        caches: &[&mut SequenceCache<KvCache>],
    ) -> Vec<Vec<f32>> {
        use rayon::prelude::*;
        let q_norm = self.qk_norms.as_ref().map(|(q, _)| q.as_slice());
        qs.par_iter()
            .enumerate()
            .map(|(t, q)| {
                let position = rows.position[t];
                let cache = &caches[rows.cache[t]].layers[layer];
                let q = heads_rotated(s, q, q_norm, position);
                q.chunks_exact(s.dims.head_dim)
                    .enumerate()
                    .flat_map(|(h, q)| attend_head(q, h, cache, position + 1, s.dims, s.scale))
                    .collect()
            })
            .collect()
    }
}

/// Each head's slice of `x`, normed by `norm` where there is one, and rotated for `position`.
fn heads_rotated(s: &RotaryGqaShape, x: &[f32], norm: Option<&[f32]>, position: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for head in x.chunks_exact(s.dims.head_dim) {
        let mut head = match norm {
            Some(weight) => rms_norm(head, weight, s.eps),
            None => head.to_vec(),
        };
        s.rope.apply(&mut head, position);
        out.extend_from_slice(&head);
    }
    out
}
