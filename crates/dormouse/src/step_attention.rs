//! Attention of one new position over its sequence's cache, computed on the host for decoding
//! steps: RoPE of the new query and key, then per head the scaled scores over every cached key,
//! a softmax and the weighted sum of the values. Each sequence of a batched step runs exactly
//! this on its own cache, so a row's bits depend on nothing but its own sequence; and it costs
//! a handful of loops instead of a few dozen tensor operations per row.
//!
//! The arithmetic, fixed: a score is the dot product of query and key (eight running sums of
//! separate products and adds, then summed in a fixed tree) divided by `sqrt(head_dim)`; the softmax subtracts the largest score, takes `exp`, sums in key order
//! and divides; the output sums `weight * value` in key order, element by element.

use candle_core::{Layout, Result, Storage, Tensor};

/// The attention output `[n_heads * head_dim]` of `query` (rotated, heads back to back) over
/// `keys` and `values` `[1, n_heads, positions, head_dim]` (the cache after this position's
/// key and value were appended).
pub(crate) fn attend(
    query: &[f32],
    keys: &Tensor,
    values: &Tensor,
    head_dim: usize,
) -> Result<Vec<f32>> {
    let (_, heads, positions, dim) = keys.dims4()?;
    if dim != head_dim || query.len() != heads * head_dim || values.dims4()? != keys.dims4()? {
        candle_core::bail!(
            "attention shapes disagree: query {}, keys {:?}",
            query.len(),
            keys.dims()
        );
    }
    let scale = (head_dim as f32).sqrt();
    let mut out = vec![0f32; query.len()];
    with_host(keys, |k, k_at| {
        with_host(values, |v, v_at| {
            let mut weights = vec![0f32; positions];
            for (h, (q, out)) in query
                .chunks(head_dim)
                .zip(out.chunks_mut(head_dim))
                .enumerate()
            {
                for (s, w) in weights.iter_mut().enumerate() {
                    *w = dot(q, &k[k_at(h, s)..][..head_dim]) / scale;
                }
                softmax_in_place(&mut weights);
                for (s, &w) in weights.iter().enumerate() {
                    for (o, &value) in out.iter_mut().zip(&v[v_at(h, s)..][..head_dim]) {
                        *o += w * value;
                    }
                }
            }
        })
    })??;
    Ok(out)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for (a, b) in a.chunks(8).zip(b.chunks(8)) {
        for ((lane, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += a * b;
        }
    }
    let h = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (h[0] + h[2]) + (h[1] + h[3])
}

fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

/// Runs `f` with the f32 storage of a `[1, H, S, D]` CPU tensor whose last axis is contiguous,
/// and a function from (head, position) to the index of that row's first element.
fn with_host<R>(
    t: &Tensor,
    f: impl FnOnce(&[f32], &dyn Fn(usize, usize) -> usize) -> R,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("decoding steps run on the CPU");
    };
    let data = cpu.as_slice::<f32>()?;
    let (head_stride, position_stride) = row_strides(layout)?;
    let start = layout.start_offset();
    Ok(f(data, &|h, s| {
        start + h * head_stride + s * position_stride
    }))
}

fn row_strides(layout: &Layout) -> Result<(usize, usize)> {
    match layout.stride() {
        [_, head, position, 1] => Ok((*head, *position)),
        other => candle_core::bail!("a cache of strides {other:?} is not row-contiguous"),
    }
}
