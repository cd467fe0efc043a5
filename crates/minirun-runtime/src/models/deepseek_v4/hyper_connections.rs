//! DeepSeek V4's hyper-connections: the residual is `hc_mult` streams; before each sub-block a
//! learned projection of the normalised streams gives the weights that collapse them into the
//! sub-block's input, spread its output back, and mix the streams (that mixing matrix made doubly
//! stochastic by Sinkhorn iterations); a last such collapse (`hc_head`) before the final norm.

use crate::blocks::norm::sigmoid;
use crate::blocks::norm::unweighted_norm;
use crate::models::deepseek_v4::config::DeepSeekV4Config;

/// A hyper-connection's parameters: `fn` `[(2 + n) n, n hidden]`, `base`, and the three scales.
pub(super) struct HyperConnection {
    pub(super) weights: Vec<f32>,
    pub(super) base: Vec<f32>,
    pub(super) scale: [f32; 3],
}

/// A hyper-connection's weights for one position: the collapsed input, and how to spread the
/// sub-block's output back over the streams and mix them.
pub(super) struct Mixing {
    pub(super) collapsed: Vec<f32>,
    post: Vec<f32>,
    /// `comb[j][k]`: stream j's share in new stream k.
    comb: Vec<f32>,
}

/// `x · rsqrt(mean(x²) + eps)` of the flattened streams, then `weights · that`.
fn stream_mixes(x: &[f32], weights: &[f32], eps: f32) -> Vec<f32> {
    let mut normed = x.to_vec();
    unweighted_norm(&mut normed, eps);
    weights
        .chunks_exact(x.len())
        .map(|row| row.iter().zip(&normed).map(|(w, v)| w * v).sum())
        .collect()
}

impl Mixing {
    pub(super) fn of(hc: &HyperConnection, streams: &[f32], c: &DeepSeekV4Config) -> Mixing {
        let (n, hidden, eps) = (c.hc_mult, c.hidden_size, c.hc_eps);
        let mixes = stream_mixes(streams, &hc.weights, c.rms_norm_eps);
        let pre: Vec<f32> = (0..n)
            .map(|j| sigmoid(mixes[j] * hc.scale[0] + hc.base[j]) + eps)
            .collect();
        let post: Vec<f32> = (0..n)
            .map(|j| 2.0 * sigmoid(mixes[n + j] * hc.scale[1] + hc.base[n + j]))
            .collect();
        let mut comb: Vec<f32> = (0..n * n)
            .map(|i| mixes[2 * n + i] * hc.scale[2] + hc.base[2 * n + i])
            .collect();
        for row in comb.chunks_exact_mut(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|v| *v = (*v - max).exp());
            let total: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v = *v / total + eps);
        }
        let normalize_columns = |comb: &mut [f32]| {
            for k in 0..n {
                let total: f32 = (0..n).map(|j| comb[j * n + k]).sum::<f32>() + eps;
                (0..n).for_each(|j| comb[j * n + k] /= total);
            }
        };
        normalize_columns(&mut comb);
        for _ in 1..c.hc_sinkhorn_iters {
            for row in comb.chunks_exact_mut(n) {
                let total: f32 = row.iter().sum::<f32>() + eps;
                row.iter_mut().for_each(|v| *v /= total);
            }
            normalize_columns(&mut comb);
        }
        let mut collapsed = vec![0f32; hidden];
        for (x, &p) in streams.chunks_exact(hidden).zip(&pre) {
            collapsed.iter_mut().zip(x).for_each(|(c, v)| *c += p * v);
        }
        Mixing {
            collapsed,
            post,
            comb,
        }
    }

    /// New streams: `post[k] · out + Σ_j comb[j][k] · streams[j]`.
    pub(super) fn expand(&self, streams: &[f32], out: &[f32]) -> Vec<f32> {
        let n = self.post.len();
        let hidden = out.len();
        let mut next = vec![0f32; n * hidden];
        for (k, y) in next.chunks_exact_mut(hidden).enumerate() {
            y.iter_mut()
                .zip(out)
                .for_each(|(y, o)| *y = self.post[k] * o);
            for (j, x) in streams.chunks_exact(hidden).enumerate() {
                let w = self.comb[j * n + k];
                y.iter_mut().zip(x).for_each(|(y, v)| *y += w * v);
            }
        }
        next
    }
}

/// `hc_head`: the streams collapsed by `sigmoid(mixes · scale + base) + eps`.
pub(super) fn head_collapse(
    streams: &[f32],
    weights: &[f32],
    base: &[f32],
    scale: f32,
    c: &DeepSeekV4Config,
) -> Vec<f32> {
    let hidden = c.hidden_size;
    let mixes = stream_mixes(streams, weights, c.rms_norm_eps);
    let mut h = vec![0f32; hidden];
    for ((x, m), b) in streams.chunks_exact(hidden).zip(&mixes).zip(base) {
        let p = sigmoid(m * scale + b) + c.hc_eps;
        h.iter_mut().zip(x).for_each(|(h, v)| *h += p * v);
    }
    h
}
