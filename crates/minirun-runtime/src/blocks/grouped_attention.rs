//! Grouped-query attention over a plain key/value cache (Qwen3-MoE; gpt-oss, with its sliding
//! windows and attention sinks): each position keeps every
//! key/value head's key (after its norm and rotation) and value; query head `h` reads key/value
//! head `h / group`.

use crate::blocks::latent_attention::dot_in_lanes;
use crate::engine::decode_policy::LayerState;

/// Grouped-query attention's sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupedDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl GroupedDims {
    /// Query heads per key/value head.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// One position's keys (or values), every key/value head side by side.
    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One layer's key/value cache: per position, every key/value head's key and value.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    positions: usize,
}

impl KvCache {
    /// One position's keys and values (each `kv_heads * head_dim`), after the others.
    pub fn push(&mut self, keys: &[f32], values: &[f32]) {
        self.keys.extend_from_slice(keys);
        self.values.extend_from_slice(values);
        self.positions += 1;
    }

    pub fn positions(&self) -> usize {
        self.positions
    }
}

impl LayerState for KvCache {
    /// Back to the first `len` positions: the cache only appends, so it can always be cut
    /// back.
    fn cut_back(&mut self, len: usize) -> bool {
        if len < self.positions {
            let width = self.keys.len() / self.positions;
            self.keys.truncate(len * width);
            self.values.truncate(len * width);
            self.positions = len;
        }
        true
    }
}

/// Which cached positions a query sees, and what else its softmax counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// The first position seen (a sliding window's start; 0 for full attention).
    pub first: usize,
    /// One past the last position seen (the query's own position + 1).
    pub end: usize,
    /// A logit the softmax's denominator counts without a value to mix (gpt-oss's attention
    /// sink, one per query head).
    pub sink: Option<f32>,
}

impl Span {
    /// Every position before `end`, no sink.
    pub fn causal(end: usize) -> Span {
        Span {
            first: 0,
            end,
            sink: None,
        }
    }
}

/// Query head `h` (`q`, already normed and rotated) of one position over the cache's first
/// `steps` positions: scores `scale * q . k`, their softmax mixing the values.
pub(crate) fn attend_head(
    q: &[f32],
    h: usize,
    cache: &KvCache,
    steps: usize,
    d: GroupedDims,
    scale: f32,
) -> Vec<f32> {
    attend_head_over(q, h, cache, Span::causal(steps), d, scale)
}

/// Query head `h` over the positions `span` names: scores `scale * q . k`, their softmax
/// (with the sink's logit in its maximum and denominator) mixing the values.
pub(crate) fn attend_head_over(
    q: &[f32],
    h: usize,
    cache: &KvCache,
    span: Span,
    d: GroupedDims,
    scale: f32,
) -> Vec<f32> {
    let (width, dim) = (d.kv_width(), d.head_dim);
    let kv = (h / d.group()) * dim;
    let q_scaled: Vec<f32> = q.iter().map(|a| a * scale).collect();
    let seen = span.first..span.end;
    let scores: Vec<f32> = seen
        .clone()
        .map(|t| dot_in_lanes(&q_scaled, &cache.keys[t * width + kv..t * width + kv + dim]))
        .collect();
    let max = scores
        .iter()
        .copied()
        .chain(span.sink)
        .fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let mut total: f32 = exps.iter().sum();
    if let Some(sink) = span.sink {
        total += (sink - max).exp();
    }
    let mut mixed = vec![0f32; dim];
    for (t, e) in seen.zip(&exps) {
        let p = e / total;
        let value = &cache.values[t * width + kv..t * width + kv + dim];
        mixed.iter_mut().zip(value).for_each(|(m, v)| *m += p * v);
    }
    mixed
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: GroupedDims = GroupedDims {
        heads: 4,
        kv_heads: 2,
        head_dim: 2,
    };

    #[test]
    fn query_heads_share_their_groups_key_value_head() {
        let mut cache = KvCache::default();
        // Position 0: kv head 0 has value [1, 0], kv head 1 value [0, 1].
        cache.push(&[0.0, 0.0, 0.0, 0.0], &[1.0, 0.0, 0.0, 1.0]);
        for h in 0..2 {
            assert_eq!(attend_head(&[1.0, 1.0], h, &cache, 1, D, 1.0), [1.0, 0.0]);
        }
        for h in 2..4 {
            assert_eq!(attend_head(&[1.0, 1.0], h, &cache, 1, D, 1.0), [0.0, 1.0]);
        }
    }

    #[test]
    fn equal_scores_average_the_values_and_later_positions_stay_unseen() {
        let mut cache = KvCache::default();
        cache.push(&[0.0; 4], &[2.0, 0.0, 0.0, 0.0]);
        cache.push(&[0.0; 4], &[0.0, 2.0, 0.0, 0.0]);
        cache.push(&[9.0; 4], &[100.0; 4]);
        assert_eq!(attend_head(&[1.0, 1.0], 0, &cache, 2, D, 1.0), [1.0, 1.0]);
        assert!(cache.cut_back(1));
        assert_eq!(cache.positions(), 1);
        assert_eq!(attend_head(&[1.0, 1.0], 0, &cache, 1, D, 1.0), [2.0, 0.0]);
    }

    #[test]
    fn a_window_hides_the_positions_before_it_and_a_sink_takes_its_share() {
        let mut cache = KvCache::default();
        cache.push(&[0.0; 4], &[100.0, 0.0, 0.0, 0.0]);
        cache.push(&[0.0; 4], &[2.0, 0.0, 0.0, 0.0]);
        cache.push(&[0.0; 4], &[0.0, 2.0, 0.0, 0.0]);
        let windowed = Span {
            first: 1,
            end: 3,
            sink: None,
        };
        assert_eq!(
            attend_head_over(&[1.0, 1.0], 0, &cache, windowed, D, 1.0),
            [1.0, 1.0]
        );
        // A sink with the scores' logit (0) takes one share of three: each value gets a third.
        let sunk = Span {
            sink: Some(0.0),
            ..windowed
        };
        let out = attend_head_over(&[1.0, 1.0], 0, &cache, sunk, D, 1.0);
        assert_eq!(out, [2.0 / 3.0, 2.0 / 3.0]);
    }
}
