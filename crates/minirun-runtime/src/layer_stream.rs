//! A layer's deterministic weights streamed from storage: the matrices every token reads in a
//! layer (attention, the router, shared experts or the dense MLP), read for one step into
//! 16 KiB-aligned buffers and dropped after it, when the budget cannot hold them all. Norm
//! vectors stay resident (they are a few KiB). The bytes a streamed layer computes from are the
//! stored bytes, as a resident layer's are, so the output has the same bits.

use std::collections::HashMap;

use crate::artifact::{Artifact, ArtifactError, LoadedPart, PartLayout, Stack, StackLayout};
use crate::config::DeepSeekV3Config;

/// Every deterministic matrix of layer `layer`, as stored, without reading it. The model's
/// builder asks for exactly these (a streamed layer that missed one would be refused by
/// [`LoadedLayer::stack`], and the streaming tests compare every logit bit with a resident run).
pub fn layer_matrices(
    artifact: &Artifact,
    c: &DeepSeekV3Config,
    layer: usize,
) -> Result<Vec<StackLayout>, ArtifactError> {
    let (hidden, heads) = (c.hidden_size, c.num_attention_heads);
    let attn = format!("model.layers.{layer}.self_attn");
    let mut wanted: Vec<(String, usize, usize)> = Vec::new();
    match c.q_lora_rank {
        Some(rank) => {
            wanted.push((format!("{attn}.q_a_proj"), rank, hidden));
            wanted.push((format!("{attn}.q_b_proj"), heads * c.q_head_dim(), rank));
        }
        None => wanted.push((format!("{attn}.q_proj"), heads * c.q_head_dim(), hidden)),
    }
    if artifact.has(&format!("{attn}.kv_b_proj.weight")) {
        let rows = heads * (c.qk_nope_head_dim + c.v_head_dim);
        wanted.push((format!("{attn}.kv_b_proj"), rows, c.kv_lora_rank));
    } else {
        wanted.push((
            format!("{attn}.embed_q"),
            c.kv_lora_rank,
            c.qk_nope_head_dim,
        ));
        wanted.push((format!("{attn}.unembed_out"), c.v_head_dim, c.kv_lora_rank));
    }
    wanted.push((
        format!("{attn}.kv_a_proj_with_mqa"),
        c.kv_lora_rank + c.qk_rope_head_dim,
        hidden,
    ));
    wanted.push((format!("{attn}.o_proj"), hidden, heads * c.v_head_dim));
    let mlp = format!("model.layers.{layer}.mlp");
    let mut push_mlp = |prefix: String, inner: usize| {
        wanted.push((format!("{prefix}.gate_proj"), inner, hidden));
        wanted.push((format!("{prefix}.up_proj"), inner, hidden));
        wanted.push((format!("{prefix}.down_proj"), hidden, inner));
    };
    if c.is_moe(layer) {
        if c.n_shared_experts > 0 {
            push_mlp(
                format!("{mlp}.shared_experts"),
                c.moe_intermediate_size * c.n_shared_experts,
            );
        }
        wanted.push((format!("{mlp}.gate"), c.n_routed_experts, hidden));
    } else {
        push_mlp(mlp, c.intermediate_size);
    }
    wanted
        .iter()
        .map(|(module, rows, cols)| artifact.stack_layout(module, *rows, *cols))
        .collect()
}

/// Bytes one read of these matrices moves from storage.
pub fn read_bytes(matrices: &[StackLayout]) -> u64 {
    parts(matrices).map(PartLayout::read_bytes).sum()
}

/// Bytes these matrices take once read into aligned buffers.
pub fn allocated_bytes(matrices: &[StackLayout]) -> u64 {
    parts(matrices).map(PartLayout::allocated_bytes).sum()
}

/// Bytes these parts take held resident: a container's whole file (its header and padding
/// included, as a resident matrix reads it), a blob member's slice.
pub fn resident_bytes<'p>(artifact: &Artifact, parts: impl Iterator<Item = &'p PartLayout>) -> u64 {
    let mut files = std::collections::BTreeSet::new();
    let mut pieces = 0;
    for part in parts {
        match part {
            PartLayout::Tile { file, .. } => {
                files.insert(*file);
            }
            p @ PartLayout::Pieces { .. } => pieces += p.read_bytes(),
        }
    }
    pieces
        + files
            .iter()
            .map(|&f| artifact.payload_file_bytes(f))
            .sum::<u64>()
}

/// Every part of these matrices.
pub fn parts(matrices: &[StackLayout]) -> impl Iterator<Item = &PartLayout> {
    matrices.iter().flat_map(|m| m.parts.iter())
}

/// One layer's deterministic matrices, read.
pub struct LoadedLayer {
    stacks: HashMap<String, (StackLayout, Vec<LoadedPart>)>,
    pub read_bytes: u64,
    pub direct_reads: u64,
    pub buffered_reads: u64,
}

impl LoadedLayer {
    /// Reads every matrix of `matrices` now, one read per tile.
    pub fn read(artifact: &Artifact, matrices: &[StackLayout]) -> Result<Self, ArtifactError> {
        let mut loaded = LoadedLayer {
            stacks: HashMap::new(),
            read_bytes: 0,
            direct_reads: 0,
            buffered_reads: 0,
        };
        for layout in matrices {
            let parts = layout
                .parts
                .iter()
                .map(|p| artifact.load_part(p))
                .collect::<Result<Vec<_>, _>>()?;
            for (direct, buffered) in parts.iter().map(LoadedPart::read_kinds) {
                loaded.direct_reads += direct;
                loaded.buffered_reads += buffered;
            }
            loaded.read_bytes += read_bytes(std::slice::from_ref(layout));
            let module = layout.name.trim_end_matches(".weight").to_string();
            loaded.stacks.insert(module, (layout.clone(), parts));
        }
        Ok(loaded)
    }

    /// The stack of `module`, computing from the bytes read.
    pub fn stack(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Stack<'_>, ArtifactError> {
        let (layout, parts) = self
            .stacks
            .get(module)
            .ok_or_else(|| ArtifactError::Tensor {
                name: format!("{module}.weight"),
                reason: "was not read with its streamed layer".into(),
            })?;
        if (layout.rows, layout.cols) != (rows, cols) {
            return Err(ArtifactError::Tensor {
                name: layout.name.clone(),
                reason: format!(
                    "was read as {} x {}, the model needs {rows} x {cols}",
                    layout.rows, layout.cols
                ),
            });
        }
        let matrices = parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let matrix_part = layout.matrix_part(i).ok_or_else(|| ArtifactError::Tensor {
                    name: layout.name.clone(),
                    reason: format!("has no matrix {i}"),
                })?;
                part.matrix(&matrix_part)
                    .map_err(|e| ArtifactError::Tensor {
                        name: layout.name.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack::new(
            layout.format,
            layout.rows,
            layout.cols,
            matrices,
        ))
    }
}
