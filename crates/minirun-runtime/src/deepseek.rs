//! The DeepSeek-V3 architecture (DeepSeek V3/R1; Kimi K2 shares it but names itself `kimi_k2`
//! and ships no `tokenizer.json`, so it is refused for now): multi-head latent attention with a cache
//! of the compressed latent, dense then mixture-of-experts layers with sigmoid, group-limited
//! routing and shared experts. A prompt runs in chunks of positions, each token after it alone;
//! every position uses the absorbed attention (queries projected into the latent space, values
//! read out of it), which is mlx-lm's decode path, and gets the same bits in a chunk as alone.
//!
//! Both stored layouts run: MLX (`embed_q` / `unembed_out`, stacked `switch_mlp` experts) and
//! Hugging Face / DeepSeek (`kv_b_proj` whole, per-expert tensors).

use crate::artifact::{Artifact, ArtifactError, StackLayout};
use crate::config::DeepSeekV3Config;
use crate::experts::{ExpertCache, ExpertParts, STACKED, routed_experts};
use crate::kernels::{Format, QMatrix};
use crate::layer_stream::{self, LayerStream, LoadedLayer, Source};
use crate::layers::{
    Activation, LatentDims, LatentProjections, Logits, Mlp, RoutedExperts, Routing, Rows,
    Streaming, add_rows, apply_batch, attend_latent, prefill_rows, rms_norm, run_routed,
    stacked_experts, weighted_sum,
};
pub use crate::layers::{ModelError, StepStats};
use crate::model::{Decoder, check_batch};
use crate::plan::{DEFAULT_READS_IN_FLIGHT, ExpertMap, Mode, Plan, Shape};
use crate::rope::{Rope, attention_scale};

/// Prompt positions run through the layers together: each matrix's bytes are read once for
/// all of them. The activations of a chunk (a few vectors of the widest projection per
/// position) stay well inside the runtime's stated overhead.
pub const PREFILL_CHUNK: usize = 64;

struct Attention<'a> {
    q_a: Option<(QMatrix<'a>, Vec<f32>)>,
    q_b: QMatrix<'a>,
    kv_a: QMatrix<'a>,
    kv_a_norm: Vec<f32>,
    latent: LatentProjections<'a>,
    o: QMatrix<'a>,
}

struct Moe<'a> {
    router: QMatrix<'a>,
    correction_bias: Vec<f32>,
    experts: RoutedExperts<'a>,
    shared: Option<Mlp<'a>>,
}

enum FeedForward<'a> {
    Dense(Mlp<'a>),
    Moe(Moe<'a>),
}

struct Layer<'a> {
    input_norm: Vec<f32>,
    attention: Attention<'a>,
    post_norm: Vec<f32>,
    ffn: FeedForward<'a>,
}

pub struct DeepSeekV3<'a> {
    pub config: DeepSeekV3Config,
    artifact: &'a Artifact,
    /// Streamed runs' loaded experts.
    cache: Option<ExpertCache>,
    embed: QMatrix<'a>,
    /// Each layer's weights held for the run, or `None` where the layer's deterministic
    /// matrices stream (read for each step by `stream`; the layer is built from them, computes,
    /// and they are dropped).
    layers: Vec<Option<Box<Layer<'a>>>>,
    stream: LayerStream,
    /// Where the routed experts are, for streamed runs (streamed layers are rebuilt each step).
    experts: Option<ExpertMap>,
    /// Threads reading a layer's chosen experts.
    reads_in_flight: usize,
    norm: Vec<f32>,
    lm_head: QMatrix<'a>,
    rope: Rope,
    scale: f32,
}

/// The latent KV cache: per layer, per position, the normalised latent and the rotated key.
pub struct Cache {
    latent: Vec<Vec<f32>>,
    rope_key: Vec<Vec<f32>>,
    pub len: usize,
}

struct Loader<'a, 'm> {
    /// Names, norm vectors and routed experts (resident runs) come from the artifact; the
    /// deterministic matrices from `source`.
    artifact: &'a Artifact,
    source: Source<'a>,
    /// Where each MoE layer's routed experts are, for a streamed run.
    streamed: Option<&'m ExpertMap>,
}

impl<'a> Loader<'a, '_> {
    fn one(&self, module: &str, rows: usize, cols: usize) -> Result<QMatrix<'a>, ArtifactError> {
        self.source
            .matrix(module, rows, cols)?
            .single(&format!("{module}.weight"))
    }

    fn mlp(&self, prefix: &str, hidden: usize, inner: usize) -> Result<Mlp<'a>, ArtifactError> {
        Ok(Mlp {
            gate: self.one(&format!("{prefix}.gate_proj"), inner, hidden)?,
            up: self.one(&format!("{prefix}.up_proj"), inner, hidden)?,
            down: self.one(&format!("{prefix}.down_proj"), hidden, inner)?,
            activation: Activation::Silu,
        })
    }

    fn experts(&self, prefix: &str, c: &DeepSeekV3Config) -> Result<Vec<Mlp<'a>>, ArtifactError> {
        let (hidden, inner, n) = (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
        let stacked = format!("{prefix}.switch_mlp");
        if !self.artifact.has(&format!("{stacked}.gate_proj.weight")) {
            return (0..n)
                .map(|e| self.mlp(&format!("{prefix}.experts.{e}"), hidden, inner))
                .collect();
        }
        stacked_experts(
            self.artifact,
            &stacked,
            (hidden, inner, n),
            Activation::Silu,
        )
    }

    fn attention(
        &self,
        prefix: &str,
        c: &DeepSeekV3Config,
    ) -> Result<Attention<'a>, ArtifactError> {
        let (hidden, heads) = (c.hidden_size, c.num_attention_heads);
        let (q_a, q_b) = match c.q_lora_rank {
            Some(rank) => (
                Some((
                    self.one(&format!("{prefix}.q_a_proj"), rank, hidden)?,
                    self.artifact
                        .vector(&format!("{prefix}.q_a_layernorm.weight"), rank)?,
                )),
                self.one(&format!("{prefix}.q_b_proj"), heads * c.q_head_dim(), rank)?,
            ),
            None => (
                None,
                self.one(&format!("{prefix}.q_proj"), heads * c.q_head_dim(), hidden)?,
            ),
        };
        let latent = if self.artifact.has(&format!("{prefix}.kv_b_proj.weight")) {
            LatentProjections::Whole(self.kv_b_proj(prefix, c)?)
        } else {
            let embed_q = self.source.matrix(
                &format!("{prefix}.embed_q"),
                c.kv_lora_rank,
                c.qk_nope_head_dim,
            )?;
            let unembed_out = self.source.matrix(
                &format!("{prefix}.unembed_out"),
                c.v_head_dim,
                c.kv_lora_rank,
            )?;
            for (s, name) in [(&embed_q, "embed_q"), (&unembed_out, "unembed_out")] {
                if s.len() != heads {
                    return Err(ArtifactError::Tensor {
                        name: format!("{prefix}.{name}.weight"),
                        reason: format!("holds {} heads; num_attention_heads is {heads}", s.len()),
                    });
                }
            }
            LatentProjections::Split {
                embed_q,
                unembed_out,
            }
        };
        Ok(Attention {
            q_a,
            q_b,
            kv_a: self.one(
                &format!("{prefix}.kv_a_proj_with_mqa"),
                c.kv_lora_rank + c.qk_rope_head_dim,
                hidden,
            )?,
            kv_a_norm: self
                .artifact
                .vector(&format!("{prefix}.kv_a_layernorm.weight"), c.kv_lora_rank)?,
            latent,
            o: self.one(&format!("{prefix}.o_proj"), hidden, heads * c.v_head_dim)?,
        })
    }

    /// The Hugging Face layout's whole `kv_b_proj`. An MLX-quantized one is refused: mlx-lm
    /// splits it and quantizes the halves again along other axes, so it computes with other
    /// weights than these.
    fn kv_b_proj(&self, prefix: &str, c: &DeepSeekV3Config) -> Result<QMatrix<'a>, ArtifactError> {
        let name = format!("{prefix}.kv_b_proj");
        let rows = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
        let m = self.one(&name, rows, c.kv_lora_rank)?;
        if matches!(m.format(), Format::Affine { .. } | Format::Mxfp4) {
            return Err(ArtifactError::Tensor {
                name: format!("{name}.weight"),
                reason: "is MLX-quantized in the Hugging Face layout; mlx-lm would re-quantize it as embed_q/unembed_out, so its result is not defined by the checkpoint. Convert with mlx-lm (which writes embed_q/unembed_out) and pack that".into(),
            });
        }
        Ok(m)
    }

    fn layer(&self, i: usize, c: &DeepSeekV3Config) -> Result<Layer<'a>, ArtifactError> {
        let prefix = format!("model.layers.{i}");
        let ffn = if c.is_moe(i) {
            let mlp = format!("{prefix}.mlp");
            let experts = match self.streamed.and_then(|m| m.get(i)?.clone()) {
                Some(parts) => RoutedExperts::Streamed { layer: i, parts },
                None => RoutedExperts::Resident(self.experts(&mlp, c)?),
            };
            FeedForward::Moe(Moe {
                router: self.one(&format!("{mlp}.gate"), c.n_routed_experts, c.hidden_size)?,
                correction_bias: self.artifact.vector(
                    &format!("{mlp}.gate.e_score_correction_bias"),
                    c.n_routed_experts,
                )?,
                experts,
                shared: match c.n_shared_experts {
                    0 => None,
                    n => Some(self.mlp(
                        &format!("{mlp}.shared_experts"),
                        c.hidden_size,
                        c.moe_intermediate_size * n,
                    )?),
                },
            })
        } else {
            FeedForward::Dense(self.mlp(
                &format!("{prefix}.mlp"),
                c.hidden_size,
                c.intermediate_size,
            )?)
        };
        Ok(Layer {
            input_norm: self
                .artifact
                .vector(&format!("{prefix}.input_layernorm.weight"), c.hidden_size)?,
            attention: self.attention(&format!("{prefix}.self_attn"), c)?,
            post_norm: self.artifact.vector(
                &format!("{prefix}.post_attention_layernorm.weight"),
                c.hidden_size,
            )?,
            ffn,
        })
    }
}

impl Moe<'_> {
    fn route(&self, logits: &[f32], c: &DeepSeekV3Config) -> Vec<(usize, f32)> {
        Routing {
            correction_bias: &self.correction_bias,
            experts_per_token: c.num_experts_per_tok,
            groups: c.n_group,
            groups_chosen: c.topk_group,
            renormalize: c.norm_topk_prob,
            renormalize_eps: 0.0,
            scaling: c.routed_scaling_factor,
        }
        .route(logits)
    }

    /// Every row of the batch through its routed experts and the shared expert. An expert is
    /// run once for all the rows that chose it; a row's outputs are then added in its router's
    /// order and the shared expert's last, whether the expert was held or read just now and
    /// however many rows the batch has: the same products, the same sum.
    fn forward(
        &self,
        xs: &[Vec<f32>],
        c: &DeepSeekV3Config,
        streaming: Option<Streaming>,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let routes: Vec<Vec<(usize, f32)>> = apply_batch(&self.router, xs, stats)?
            .iter()
            .map(|logits| self.route(logits, c))
            .collect();
        let shared = |stats: &mut StepStats| -> Result<Option<Vec<Vec<f32>>>, ModelError> {
            Ok(self
                .shared
                .as_ref()
                .map(|s| s.forward(xs, stats))
                .transpose()?)
        };
        let (outputs, shared) = run_routed(
            &self.experts,
            Activation::Silu,
            &routes,
            xs,
            streaming,
            c.num_experts_per_tok,
            shared,
            stats,
        )?;
        let mut ys = weighted_sum(&routes, &outputs, c.hidden_size);
        if let Some(shared) = shared {
            add_rows(&mut ys, &shared);
        }
        Ok(ys)
    }
}

impl Shape for DeepSeekV3Config {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_tok
    }

    /// Per layer and position, the latent and the rotated key, in f32.
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        ((self.kv_lora_rank + self.qk_rope_head_dim) as u64)
            .saturating_mul(4 * self.num_hidden_layers as u64)
            .saturating_mul(context_tokens as u64)
    }

    fn routed_experts(
        &self,
        artifact: &Artifact,
        layer: usize,
    ) -> Option<Result<Vec<ExpertParts>, ArtifactError>> {
        let sizes = (
            self.hidden_size,
            self.moe_intermediate_size,
            self.n_routed_experts,
        );
        self.is_moe(layer).then(|| {
            routed_experts(
                artifact,
                &format!("model.layers.{layer}.mlp"),
                sizes,
                STACKED,
            )
        })
    }

    fn streamable_matrices(
        &self,
        artifact: &Artifact,
        layer: usize,
    ) -> Result<Vec<StackLayout>, ArtifactError> {
        layer_stream::layer_matrices(artifact, self, layer)
    }
}

impl Decoder for DeepSeekV3<'_> {
    type Cache = Cache;

    fn new_cache(&self) -> Cache {
        let n = self.layers.len();
        Cache {
            latent: vec![Vec::new(); n],
            rope_key: vec![Vec::new(); n],
            len: 0,
        }
    }

    fn cached(&self, cache: &Cache) -> usize {
        cache.len
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    /// Every sequence's token as one row of one batch through every layer: each matrix, and
    /// each streamed layer and expert, is read once for all the rows, and each row gets the bits
    /// `step` gives it alone (rows compute independently; attention reads its own cache). On an
    /// error every cache is left as it was.
    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        check_batch(tokens, caches)?;
        let before: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let rows = Rows::one_each(caches.iter().map(|c| c.len));
        let result = self.forward_rows(tokens, &rows, caches, Logits::Every, stats);
        if result.is_err() {
            for (cache, len) in caches.iter_mut().zip(before) {
                self.truncate(cache, len);
            }
        }
        result
    }

    /// Every prompt's positions as the rows of shared passes of [`PREFILL_CHUNK`] rows, each
    /// row with the bits its own prefill gives it. On an error every cache is left as it was.
    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if prompts.len() != caches.len() {
            return Err(ModelError::BatchShape {
                tokens: prompts.len(),
                caches: caches.len(),
            });
        }
        if prompts.iter().any(|p| p.is_empty()) {
            return Err(ModelError::EmptyPrompt);
        }
        let before: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let result = prefill_rows(prompts, &before, PREFILL_CHUNK, |tokens, rows, logits| {
            self.forward_rows(tokens, rows, caches, logits, stats)
        });
        if result.is_err() {
            for (cache, len) in caches.iter_mut().zip(before) {
                self.truncate(cache, len);
            }
        }
        result
    }

    /// Bytes of routed experts the cache holds now, and the most it held at once with the
    /// experts of a layer in flight; `None` for a resident run (held layers are resident).
    fn expert_memory(&self) -> Option<(u64, u64)> {
        self.cache.as_ref().map(ExpertCache::usage)
    }
}

impl<'a> DeepSeekV3<'a> {
    /// The model with every weight resident.
    pub fn load(
        artifact: &'a Artifact,
        config: DeepSeekV3Config,
    ) -> Result<DeepSeekV3<'a>, ModelError> {
        DeepSeekV3::build(artifact, config, None, &[])
    }

    /// The model as `plan` says: fully resident, or the routed experts of `plan.held_layers`
    /// read now and held resident, the others' streamed through a cache of `plan.cache_bytes`,
    /// and the deterministic weights of `plan.streamed_layers` read for each step.
    pub fn load_planned(
        artifact: &'a Artifact,
        config: DeepSeekV3Config,
        plan: &Plan,
        experts: ExpertMap,
    ) -> Result<DeepSeekV3<'a>, ModelError> {
        match plan.mode {
            Mode::Resident => DeepSeekV3::build(artifact, config, None, &[]),
            Mode::Streamed => {
                let experts = plan.streamed_experts(experts);
                let mut model =
                    DeepSeekV3::build(artifact, config, Some(experts), &plan.streamed_layers)?;
                model.cache = Some(plan.start_streaming(artifact));
                model.stream.read_ahead = plan.read_ahead;
                model.reads_in_flight = plan.reads_in_flight;
                Ok(model)
            }
        }
    }

    fn build(
        artifact: &'a Artifact,
        config: DeepSeekV3Config,
        streamed_experts: Option<ExpertMap>,
        streamed_layers: &[usize],
    ) -> Result<DeepSeekV3<'a>, ModelError> {
        let c = &config;
        let loader = Loader {
            artifact,
            source: Source::Resident(artifact),
            streamed: streamed_experts.as_ref(),
        };
        let (layers, stream) =
            layer_stream::held_or_streamed(artifact, c, streamed_layers, |i| loader.layer(i, c))?;
        let embed = loader.one("model.embed_tokens", c.vocab_size, c.hidden_size)?;
        let lm_head = loader.one("lm_head", c.vocab_size, c.hidden_size)?;
        Ok(DeepSeekV3 {
            embed,
            norm: artifact.vector("model.norm.weight", c.hidden_size)?,
            lm_head,
            rope: Rope::new(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling.as_ref()),
            scale: attention_scale(c.q_head_dim(), c.rope_scaling.as_ref()),
            layers,
            stream,
            experts: streamed_experts,
            reads_in_flight: DEFAULT_READS_IN_FLIGHT,
            artifact,
            cache: None,
            config,
        })
    }

    /// Layer `i` built from its deterministic matrices read for this step.
    fn streamed_layer<'l>(
        &'l self,
        i: usize,
        loaded: &'l LoadedLayer,
    ) -> Result<Layer<'l>, ModelError> {
        let loader = Loader {
            artifact: self.artifact,
            source: Source::Streamed(loaded),
            streamed: self.experts.as_ref(),
        };
        Ok(loader.layer(i, &self.config)?)
    }

    fn truncate(&self, cache: &mut Cache, len: usize) {
        let (lora, rope) = (self.config.kv_lora_rank, self.config.qk_rope_head_dim);
        cache.latent.iter_mut().for_each(|l| l.truncate(len * lora));
        cache
            .rope_key
            .iter_mut()
            .for_each(|k| k.truncate(len * rope));
        cache.len = len;
    }

    /// `tokens` through every layer, row `r` at `rows.position[r]` of `caches[rows.cache[r]]`;
    /// the logits `logits` asks for.
    fn forward_rows(
        &self,
        tokens: &[u32],
        rows: &Rows,
        caches: &mut [&mut Cache],
        logits: Logits,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::Token(token, c.vocab_size));
        }
        if let Some(&last) = rows.position.iter().max()
            && last >= c.max_position_embeddings
        {
            return Err(ModelError::Position(last, c.max_position_embeddings));
        }
        let mut hs = Vec::with_capacity(tokens.len());
        for &token in tokens {
            let mut h = vec![0f32; c.hidden_size];
            self.embed.dequantize_row(token as usize, &mut h)?;
            stats.weight_bytes += (self.embed.stored_bytes() / self.embed.rows) as u64;
            hs.push(h);
        }
        let mut state = (hs, caches);
        self.stream.run(
            self.artifact,
            &mut state,
            stats,
            |(hs, caches), i, loaded, stats| {
                let built;
                let layer = match (loaded, &self.layers[i]) {
                    (Some(loaded), _) => {
                        built = self.streamed_layer(i, loaded)?;
                        &built
                    }
                    (None, Some(layer)) => layer,
                    (None, None) => {
                        return Err(ModelError::Artifact(ArtifactError::Tensor {
                            name: format!("model.layers.{i}"),
                            reason: "is neither held nor streamed".into(),
                        }));
                    }
                };
                self.run_layer(layer, i, hs, rows, caches, stats)
            },
            |(hs, caches), stats| {
                for &seq in &rows.cache {
                    caches[seq].len += 1;
                }
                let wanted = logits.rows(hs.len());
                if wanted.is_empty() {
                    return Ok(Vec::new());
                }
                let xs: Vec<Vec<f32>> = wanted
                    .iter()
                    .map(|&r| rms_norm(&hs[r], &self.norm, c.rms_norm_eps))
                    .collect();
                Ok(apply_batch(&self.lm_head, &xs, stats)?)
            },
        )
    }

    /// The streamed layer already read for the next step, if any (read-ahead reads the first
    /// one while a step's last layers compute).
    pub fn layer_read_for_next_step(&self) -> Option<usize> {
        self.stream.read_for_next_step()
    }

    fn run_layer(
        &self,
        layer: &Layer,
        i: usize,
        hs: &mut [Vec<f32>],
        rows: &Rows,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let norm = |hs: &[Vec<f32>], weight: &[f32]| -> Vec<Vec<f32>> {
            hs.iter()
                .map(|h| rms_norm(h, weight, c.rms_norm_eps))
                .collect()
        };
        let xs = norm(hs, &layer.input_norm);
        let attn = self.attend(&layer.attention, &xs, i, rows, caches, stats)?;
        add_rows(hs, &attn);
        let xs = norm(hs, &layer.post_norm);
        let out = match &layer.ffn {
            FeedForward::Dense(mlp) => mlp.forward(&xs, stats)?,
            FeedForward::Moe(moe) => {
                let streaming = self
                    .cache
                    .as_ref()
                    .map(|cache| (self.artifact, cache, self.reads_in_flight));
                moe.forward(&xs, c, streaming, stats)?
            }
        };
        add_rows(hs, &out);
        Ok(())
    }

    /// Attention for a batch of rows: every row's latent and rotated key go into its cache
    /// first, then each row attends to its cache up to its own position.
    fn attend(
        &self,
        a: &Attention,
        xs: &[Vec<f32>],
        layer: usize,
        rows: &Rows,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let qs = match &a.q_a {
            Some((q_a, norm)) => {
                let latent_q: Vec<Vec<f32>> = apply_batch(q_a, xs, stats)?
                    .iter()
                    .map(|q| rms_norm(q, norm, 1e-6))
                    .collect();
                apply_batch(&a.q_b, &latent_q, stats)?
            }
            None => apply_batch(&a.q_b, xs, stats)?,
        };
        let lora = c.kv_lora_rank;
        for (t, kv) in apply_batch(&a.kv_a, xs, stats)?.iter().enumerate() {
            let latent = rms_norm(&kv[..lora], &a.kv_a_norm, 1e-6);
            let mut key = kv[lora..].to_vec();
            self.rope.apply(&mut key, rows.position[t]);
            let cache = &mut caches[rows.cache[t]];
            cache.latent[layer].extend_from_slice(&latent);
            cache.rope_key[layer].extend_from_slice(&key);
        }
        let q_latents = self.queries_in_latent_space(a, &qs, stats)?;
        let mixed = self.mix_all_heads(&qs, &q_latents, layer, rows, caches);
        let outs = self.heads_out(a, &mixed, stats)?;
        Ok(apply_batch(&a.o, &outs, stats)?)
    }

    fn queries_in_latent_space(
        &self,
        a: &Attention,
        qs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<Vec<f32>>>, ModelError> {
        Ok(a.latent.queries(qs, self.latent_dims(), stats)?)
    }

    fn latent_dims(&self) -> LatentDims {
        let c = &self.config;
        LatentDims {
            heads: c.num_attention_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v: c.v_head_dim,
            lora: c.kv_lora_rank,
        }
    }

    /// Every row's heads ([`Self::mix_head`]), each (row, head) on whichever worker takes it:
    /// they are independent, so each has the bits it has computed alone.
    fn mix_all_heads(
        &self,
        qs: &[Vec<f32>],
        q_latents: &[Vec<Vec<f32>>],
        layer: usize,
        rows: &Rows,
        caches: &[&mut Cache],
    ) -> Vec<Vec<Vec<f32>>> {
        use rayon::prelude::*;
        let c = &self.config;
        let width = c.qk_nope_head_dim + c.qk_rope_head_dim;
        qs.par_iter()
            .zip(q_latents)
            .enumerate()
            .map(|(t, (q, q_latent))| {
                let cache = &*caches[rows.cache[t]];
                q.par_chunks_exact(width)
                    .zip(q_latent)
                    .map(|(q, q_latent)| self.mix_head(q, q_latent, layer, rows.position[t], cache))
                    .collect()
            })
            .collect()
    }

    /// One head of one position over the cache's positions up to and including `position`:
    /// the cached latents mixed by the softmax of the scores.
    fn mix_head(
        &self,
        q: &[f32],
        q_latent: &[f32],
        layer: usize,
        position: usize,
        cache: &Cache,
    ) -> Vec<f32> {
        let nope = self.config.qk_nope_head_dim;
        let (latents, keys) = (&cache.latent[layer], &cache.rope_key[layer]);
        let mut q_rope = q[nope..].to_vec();
        self.rope.apply(&mut q_rope, position);
        attend_latent(q_latent, &q_rope, latents, keys, position + 1, self.scale)
    }

    fn heads_out(
        &self,
        a: &Attention,
        mixed: &[Vec<Vec<f32>>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(a.latent.heads_out(mixed, self.latent_dims(), stats)?)
    }
}
