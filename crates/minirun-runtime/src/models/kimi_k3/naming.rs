//! How a Kimi K3 checkpoint names its tensors: under `language_model.` (as mlx-lm saves the text
//! model) or bare, and with mlx-lm's module names or the upstream checkpoint's (which the
//! published Kimi K3 artifact keeps). Each is read from the artifact's own names; a checkpoint
//! with both or neither is refused.

use minirun_stream::artifact::ArtifactError;
use minirun_stream::weights::Weights;

use crate::models::kimi_k3::config::KimiK3Config;

/// The stored names: mlx-lm saves the text model under `language_model.`, a text-only
/// checkpoint has no such prefix.
pub(super) fn name_root(w: &Weights) -> Result<&'static str, ArtifactError> {
    let wrapped = w.has("language_model.model.embed_tokens.weight");
    let bare = w.has("model.embed_tokens.weight");
    match (wrapped, bare) {
        (true, false) => Ok("language_model."),
        (false, true) => Ok(""),
        (true, true) => Err(ArtifactError::Tensor {
            name: "model.embed_tokens.weight".into(),
            reason: "is stored both bare and under language_model.; which one is the model is not defined".into(),
        }),
        (false, false) => Err(ArtifactError::Tensor {
            name: "language_model.model.embed_tokens.weight".into(),
            reason: "is not in the artifact (nor model.embed_tokens.weight): this is not a Kimi K3 text model".into(),
        }),
    }
}

/// How a checkpoint names K3's tensors: as mlx-lm saves them, or as the upstream checkpoint (and
/// the published Kimi K3 artifact) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Naming {
    /// `qkv_proj`, `qkv_conv.conv`, `embed_q`/`unembed_out`, `mlp.switch_mlp`, `*_res_proj`.
    Mlx,
    /// `q/k/v_proj`, `q/k/v_conv1d`, `kv_b_proj`, `block_sparse_moe.experts.E.w1/w3/w2`,
    /// `*_res.proj_weight`.
    HuggingFace,
}

impl Naming {
    /// Which one the artifact uses, from layer 0's attention; a checkpoint with both or
    /// neither is refused.
    pub(super) fn of(w: &Weights, c: &KimiK3Config, root: &str) -> Result<Naming, ArtifactError> {
        let attn = format!("{root}model.layers.0.self_attn");
        let (mlx, hf) = match c.is_kda(0) {
            true => ("qkv_proj.weight", "q_proj.weight"),
            false => ("embed_q.weight", "kv_b_proj.weight"),
        };
        let (mlx, hf) = (format!("{attn}.{mlx}"), format!("{attn}.{hf}"));
        match (w.has(&mlx), w.has(&hf)) {
            (true, false) => Ok(Naming::Mlx),
            (false, true) => Ok(Naming::HuggingFace),
            (both, _) => Err(ArtifactError::Tensor {
                name: mlx,
                reason: match both {
                    true => {
                        format!("and {hf} are both stored: which one the model is, is not defined")
                    }
                    false => format!(
                        "is not in the artifact, nor {hf}: this is not a Kimi K3 text model"
                    ),
                },
            }),
        }
    }

    /// Layer `lp`'s mixture of experts.
    pub(super) fn moe(self, lp: &str) -> String {
        match self {
            Naming::Mlx => format!("{lp}.mlp"),
            Naming::HuggingFace => format!("{lp}.block_sparse_moe"),
        }
    }

    pub(super) fn correction_bias(self, moe: &str) -> String {
        match self {
            Naming::Mlx => format!("{moe}.e_score_correction_bias"),
            Naming::HuggingFace => format!("{moe}.gate.e_score_correction_bias"),
        }
    }

    /// An attention-residual query's norm and projection weights (`which` is
    /// `self_attention_res`, `mlp_res` or `output_attn_res`).
    pub(super) fn residual(self, prefix: &str, which: &str) -> (String, String) {
        match self {
            Naming::Mlx => (
                format!("{prefix}.{which}_norm.weight"),
                format!("{prefix}.{which}_proj.weight"),
            ),
            Naming::HuggingFace => (
                format!("{prefix}.{which}.norm_weight"),
                format!("{prefix}.{which}.proj_weight"),
            ),
        }
    }
}
