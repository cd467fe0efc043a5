//! The pre-norm decoder most MoE models are (DeepSeek-V3, Qwen3-MoE): each layer adds
//! `attention(rms_norm(x))` to `x`, then `ffn(rms_norm(h))` to `h`, the feed-forward a dense MLP
//! or the architecture's routed experts; the model ends in a final RMSNorm and the LM head.
//! What differs between such architectures (their attention, their routing) is handed in.

use crate::blocks::mlp::Mlp;
use crate::blocks::norm::rms_norm;
use crate::blocks::products::add_rows;
use crate::blocks::tables::{embed_tokens, head_logits};
use minirun_stream::artifact::ArtifactError;
use minirun_stream::matrix::Matrix;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::tables::{Table, TableUse};
use minirun_stream::weights::Weights;

/// A layer's feed-forward: a dense MLP, or `R`, the architecture's routed experts.
#[allow(
    clippy::large_enum_variant,
    reason = "one per layer, built once and never moved on a hot path; R's size is the architecture's"
)]
pub enum FeedForward<'a, R> {
    Dense(Mlp<Matrix<'a>>),
    Routed(R),
}

/// One pre-norm layer: its two norms around its attention `A` and feed-forward.
pub struct PreNormLayer<'a, A, R> {
    pub input_norm: Vec<f32>,
    pub attention: A,
    pub post_norm: Vec<f32>,
    pub ffn: FeedForward<'a, R>,
}

impl<'a, A, R> PreNormLayer<'a, A, R> {
    /// The layer's norms under `w` (`input_layernorm`, `post_attention_layernorm`) around the
    /// attention and the feed-forward the caller built, in that order: the order a pass
    /// computes with their matrices, which a streamed layer reads them in.
    pub fn new(
        w: &Weights<'a>,
        hidden: usize,
        attention: A,
        ffn: FeedForward<'a, R>,
    ) -> Result<Self, ArtifactError> {
        Ok(PreNormLayer {
            input_norm: w.vector("input_layernorm.weight", hidden)?,
            attention,
            post_norm: w.vector("post_attention_layernorm.weight", hidden)?,
            ffn,
        })
    }

    /// `hs += attend(rms_norm(hs))`, then `hs += ffn(rms_norm(hs))`, row by row; `routed`
    /// runs the architecture's experts.
    pub fn run(
        &self,
        hs: &mut [Vec<f32>],
        eps: f32,
        attend: impl FnOnce(&A, &[Vec<f32>], &mut StepStats) -> Result<Vec<Vec<f32>>, ModelError>,
        routed: impl FnOnce(&R, &[Vec<f32>], &mut StepStats) -> Result<Vec<Vec<f32>>, ModelError>,
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        let norm = |hs: &[Vec<f32>], weight: &[f32]| -> Vec<Vec<f32>> {
            hs.iter().map(|h| rms_norm(h, weight, eps)).collect()
        };
        let attn = attend(&self.attention, &norm(hs, &self.input_norm), stats)?;
        add_rows(hs, &attn);
        let xs = norm(hs, &self.post_norm);
        let out = match &self.ffn {
            FeedForward::Dense(mlp) => mlp.forward(&xs, stats)?,
            FeedForward::Routed(experts) => routed(experts, &xs, stats)?,
        };
        add_rows(hs, &out);
        Ok(())
    }
}

impl<A, R> PreNormLayer<'_, A, R> {
    /// The layer's routed experts and the input its router would meet if the layer's
    /// attention added nothing to `h`: `rms_norm(h)` by the post-attention norm. `None` on a
    /// dense layer.
    pub fn routed_input(&self, h: &[f32], eps: f32) -> Option<(&R, Vec<f32>)> {
        match &self.ffn {
            FeedForward::Routed(routed) => Some((routed, rms_norm(h, &self.post_norm, eps))),
            FeedForward::Dense(_) => None,
        }
    }
}

/// The weights outside the layers: the token embedding, the final norm and the LM head (the
/// embedding itself when the head is tied to it).
pub struct Ends<'a> {
    embed: Table<'a>,
    norm: Vec<f32>,
    lm_head: Table<'a>,
}

impl<'a> Ends<'a> {
    /// `model.embed_tokens`, `model.norm` and `lm_head` (or, `tied`, the embedding again).
    pub fn new(
        w: &Weights<'a>,
        (vocab, hidden): (usize, usize),
        tied: bool,
    ) -> Result<Ends<'a>, ArtifactError> {
        let shape = (vocab, hidden);
        let (embed, lm_head) = match tied {
            true => {
                let both = w.table("model.embed_tokens", shape, TableUse::EmbeddingAndHead)?;
                (both.clone(), both)
            }
            false => (
                w.table("model.embed_tokens", shape, TableUse::Embedding)?,
                w.table("lm_head", shape, TableUse::Head)?,
            ),
        };
        Ok(Ends {
            embed,
            norm: w.vector("model.norm.weight", hidden)?,
            lm_head,
        })
    }

    pub fn embed(
        &self,
        tokens: &[u32],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        embed_tokens(&self.embed, tokens, stats)
    }

    /// The logits of the `wanted` rows of `hs`: final norm, then the head.
    pub fn logits(
        &self,
        hs: &[Vec<f32>],
        wanted: &[usize],
        eps: f32,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let xs: Vec<Vec<f32>> = wanted
            .iter()
            .map(|&r| rms_norm(&hs[r], &self.norm, eps))
            .collect();
        head_logits(&self.lm_head, &xs, stats)
    }
}

/// The `Layered` methods every pre-norm model writes alike: written once here, used inside
/// each such architecture's `impl Layered` as `pre_norm_layered!(Config, LayerCache)`. The model
/// struct has `config` (with `num_hidden_layers` and `rms_norm_eps`) and `ends` ([`Ends`]); its
/// module has `layer(w, config, i)` building a `Layer<'w>`; the model has `attend(attention,
/// xs, layer, rows, caches, stats)`, and its routed block `forward(xs, config, stats)` and
/// `routes(xs, config, stats)` (each row's experts and weights, in the router's order).
macro_rules! pre_norm_layered {
    ($config:ty, $cache:ty) => {
        fn config(&self) -> &$config {
            &self.config
        }

        fn layer<'w>(
            config: &$config,
            w: &minirun_stream::weights::Weights<'w>,
            i: usize,
        ) -> Result<Layer<'w>, minirun_stream::artifact::ArtifactError> {
            layer(w, config, i)
        }

        fn new_cache(&self) -> $crate::engine::decode_policy::SequenceCache<$cache> {
            $crate::engine::decode_policy::SequenceCache::new(vec![
                <$cache>::default();
                self.config.num_hidden_layers
            ])
        }

        fn embed(
            &self,
            tokens: &[u32],
            stats: &mut minirun_stream::step::StepStats,
        ) -> Result<Vec<Vec<f32>>, minirun_stream::step::ModelError> {
            self.ends.embed(tokens, stats)
        }

        fn run_layer(
            &self,
            layer: &Layer<'_>,
            at: $crate::engine::decode_policy::Place,
            _tokens: &[u32],
            hs: &mut Vec<Vec<f32>>,
            caches: &mut [&mut $crate::engine::decode_policy::SequenceCache<$cache>],
            stats: &mut minirun_stream::step::StepStats,
        ) -> Result<(), minirun_stream::step::ModelError> {
            let c = &self.config;
            layer.run(
                hs,
                c.rms_norm_eps,
                |a, xs, stats| self.attend(a, xs, at.layer, at.rows, caches, stats),
                |moe, xs, stats| moe.forward(xs, c, stats),
                stats,
            )
        }

        /// The layer's router on the row's state as it is now, normed as for the layer's
        /// feed-forward.
        fn guess_experts(
            &self,
            layer: &Layer<'_>,
            _i: usize,
            _tokens: &[u32],
            hs: &Vec<Vec<f32>>,
        ) -> Option<Vec<usize>> {
            let c = &self.config;
            let (routed, x) = layer.routed_input(hs.first()?, c.rms_norm_eps)?;
            let routes = routed.routes(&[x], c, &mut minirun_stream::step::StepStats::default());
            $crate::blocks::moe::first_row_experts(routes)
        }

        fn logits(
            &self,
            hs: &Vec<Vec<f32>>,
            wanted: &[usize],
            stats: &mut minirun_stream::step::StepStats,
        ) -> Result<Vec<Vec<f32>>, minirun_stream::step::ModelError> {
            self.ends
                .logits(hs, wanted, self.config.rms_norm_eps, stats)
        }
    };
}
pub(crate) use pre_norm_layered;
