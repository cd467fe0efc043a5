//! The memory plan of a run: what stays resident, what streams, and whether the budget pays for
//! it. Resident always: the embeddings, attention, norms, routers, dense MLPs and shared experts
//! (the weights every token reads). What the budget pays for beyond the floor goes, in this
//! order, to whole MoE layers (every routed expert of the layer held, read once when the model
//! is loaded; first layers first) and then to a cache of routed experts for the other layers.
//! Routed experts of the layers not held stream from storage; a budget that holds everything
//! runs fully resident.
//!
//! Whole layers come before the cache because they make a token's reads exact: a held layer
//! reads nothing per token, a streamed layer reads its chosen experts unless the cache has
//! them, so with no cache left over a step reads exactly `uncached_read_per_token`.
//!
//! The floor is the least a run can work in: the resident weights, the slot pool (one layer's
//! chosen experts, loaded at once), and a stated reserve (the KV cache for the run's context plus
//! a fixed allowance for activations, the tokenizer and the runtime). A budget below the floor is
//! refused before a payload byte is read, naming every term.

use crate::artifact::{Artifact, ArtifactError, PartLayout};
use crate::budget::{Budget, human};
use crate::config::DeepSeekV3Config;
use crate::experts::{ExpertParts, routed_experts};

/// Activations, the tokenizer and the runtime's own heap, beside the KV cache.
pub const FIXED_RESERVE: u64 = 16 << 20;

/// How the run holds its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every weight read once and held.
    Resident,
    /// Routed experts read from storage when the router picks them, cached within the budget.
    Streamed,
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    BelowFloor(Box<BelowFloor>),
}

/// A budget below the floor, with every term of the floor.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "--budget {budget} is below this run's floor of {}: resident weights {} + slot pool {} ({experts_per_token} experts of {}) + reserve {} (KV cache for {context_tokens} tokens + {} fixed). Give --budget {floor} or more, or --budget floor",
    human(*floor), human(*resident), human(*slot_pool), human(*expert), human(*reserve), human(FIXED_RESERVE)
)]
pub struct BelowFloor {
    pub budget: String,
    pub floor: u64,
    pub resident: u64,
    pub slot_pool: u64,
    pub experts_per_token: usize,
    pub expert: u64,
    pub reserve: u64,
    pub context_tokens: usize,
}

/// What the run keeps resident, what it streams, and what the budget leaves for the cache.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub mode: Mode,
    pub budget: u64,
    /// Weights every token reads, held resident.
    pub resident_bytes: u64,
    /// Every routed expert, as stored.
    pub routed_bytes: u64,
    /// The largest routed expert's read, and its footprint in aligned buffers.
    pub expert_read_bytes: u64,
    pub expert_allocated_bytes: u64,
    pub experts_per_token: usize,
    pub moe_layers: usize,
    pub slot_pool_bytes: u64,
    pub reserve_bytes: u64,
    /// Tokens of context the reserve's KV cache is sized for.
    pub context_tokens: usize,
    pub floor: u64,
    /// What a fully resident run needs: every payload byte and the reserve.
    pub everything: u64,
    /// MoE layers whose routed experts are all held, read once when the model is loaded.
    pub held_layers: Vec<usize>,
    /// What the held layers' experts take in aligned buffers.
    pub held_bytes: u64,
    /// Bytes of experts of the other layers the cache may hold.
    pub cache_bytes: u64,
    /// Routed-expert bytes a decode step reads when the cache holds none of the experts it
    /// needs: the chosen experts of every MoE layer not held.
    pub uncached_read_per_token: u64,
}

/// Every MoE layer's routed experts, by layer (`None` for a dense layer).
pub type ExpertMap = Vec<Option<Vec<ExpertParts>>>;

/// Where every routed expert of the model is.
pub fn expert_map(artifact: &Artifact, c: &DeepSeekV3Config) -> Result<ExpertMap, ArtifactError> {
    (0..c.num_hidden_layers)
        .map(|layer| {
            c.is_moe(layer)
                .then(|| routed_experts(artifact, c, layer))
                .transpose()
        })
        .collect()
}

impl Plan {
    /// Plans a run of at most `context_tokens` positions under `budget`.
    pub fn new(
        artifact: &Artifact,
        c: &DeepSeekV3Config,
        experts: &ExpertMap,
        budget: Budget,
        context_tokens: usize,
    ) -> Result<Plan, PlanError> {
        let mut container_files = std::collections::BTreeSet::new();
        let mut pieces = 0u64;
        let (mut routed_bytes, mut read_max, mut alloc_max) = (0u64, 0, 0);
        let mut moe_layers = 0;
        // Per MoE layer: its index, what a token reads there uncached, what holding it takes.
        let mut layer_costs: Vec<(usize, u64, u64)> = Vec::new();
        for (index, layer) in experts.iter().enumerate() {
            let Some(layer) = layer else { continue };
            moe_layers += 1;
            let largest = layer.iter().map(ExpertParts::read_bytes).max().unwrap_or(0);
            layer_costs.push((
                index,
                largest * c.num_experts_per_tok as u64,
                layer.iter().map(ExpertParts::allocated_bytes).sum(),
            ));
            read_max = read_max.max(largest);
            alloc_max = alloc_max.max(
                layer
                    .iter()
                    .map(ExpertParts::allocated_bytes)
                    .max()
                    .unwrap_or(0),
            );
            for expert in layer {
                routed_bytes += expert.read_bytes();
                for part in [&expert.gate, &expert.up, &expert.down] {
                    match &part.part {
                        PartLayout::Tile { file, .. } => {
                            container_files.insert(*file);
                        }
                        p @ PartLayout::Pieces { .. } => pieces += p.read_bytes(),
                    }
                }
            }
        }
        let streamed_files: u64 = container_files
            .iter()
            .map(|&f| artifact.payload_file_bytes(f))
            .sum();
        let total = artifact.total_payload_bytes();
        let resident_bytes = total.saturating_sub(streamed_files + pieces);
        let kv_per_token =
            (c.kv_lora_rank + c.qk_rope_head_dim) as u64 * 4 * c.num_hidden_layers as u64;
        let reserve_bytes = FIXED_RESERVE + kv_per_token * context_tokens as u64;
        let slot_pool_bytes = alloc_max * c.num_experts_per_tok as u64;
        let floor = resident_bytes + slot_pool_bytes + reserve_bytes;
        let everything = total + reserve_bytes;
        let budget_bytes = match budget {
            Budget::Bytes(b) => b,
            Budget::Floor => floor,
            Budget::Balanced => floor + everything.saturating_sub(floor) / 2,
            Budget::Generous => everything.max(floor),
        };
        if budget_bytes < floor {
            return Err(PlanError::BelowFloor(Box::new(BelowFloor {
                budget: budget.to_string(),
                floor,
                resident: resident_bytes,
                slot_pool: slot_pool_bytes,
                experts_per_token: c.num_experts_per_tok,
                expert: alloc_max,
                reserve: reserve_bytes,
                context_tokens,
            })));
        }
        let mode = match moe_layers > 0 && budget_bytes < everything {
            true => Mode::Streamed,
            false => Mode::Resident,
        };
        let mut spare = budget_bytes - floor;
        let (mut held_layers, mut held_bytes, mut uncached) = (Vec::new(), 0u64, 0u64);
        let mut holding = mode == Mode::Streamed;
        for &(index, per_token, hold) in &layer_costs {
            // Held while the spare budget pays for the whole layer, in layer order: the first
            // layer that does not fit, and every one after it, streams.
            holding &= hold <= spare;
            if holding {
                spare -= hold;
                held_bytes += hold;
                held_layers.push(index);
            } else {
                uncached += per_token;
            }
        }
        Ok(Plan {
            mode,
            budget: budget_bytes,
            resident_bytes,
            routed_bytes,
            expert_read_bytes: read_max,
            expert_allocated_bytes: alloc_max,
            experts_per_token: c.num_experts_per_tok,
            moe_layers,
            slot_pool_bytes,
            reserve_bytes,
            context_tokens,
            floor,
            everything,
            held_layers,
            held_bytes,
            cache_bytes: spare,
            uncached_read_per_token: uncached,
        })
    }

    /// The plan in lines, for the run's header.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "budget {} ({}): floor {} = resident {} + slot pool {} ({} x {}) + reserve {}",
            human(self.budget),
            match self.mode {
                Mode::Resident => "fully resident",
                Mode::Streamed => "routed experts streamed",
            },
            human(self.floor),
            human(self.resident_bytes),
            human(self.slot_pool_bytes),
            self.experts_per_token,
            human(self.expert_allocated_bytes),
            human(self.reserve_bytes),
        )];
        if self.mode == Mode::Streamed {
            if !self.held_layers.is_empty() {
                lines.push(format!(
                    "held whole: {} of {} MoE layers ({}), {}, read once at load",
                    self.held_layers.len(),
                    self.moe_layers,
                    layer_list(&self.held_layers),
                    human(self.held_bytes),
                ));
            }
            lines.push(format!(
                "streamed: the routed experts of {} MoE layers ({} in all); expert cache {}; without cache hits a token reads {}",
                self.moe_layers - self.held_layers.len(),
                human(self.routed_bytes),
                human(self.cache_bytes),
                human(self.uncached_read_per_token),
            ));
        }
        lines
    }
}

/// `3-5, 9` for layers 3, 4, 5 and 9.
fn layer_list(layers: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &layer in layers {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == layer => *end = layer,
            _ => runs.push((layer, layer)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .map(|&(a, b)| match a == b {
            true => a.to_string(),
            false => format!("{a}-{b}"),
        })
        .collect();
    format!(
        "layer{} {}",
        if layers.len() == 1 { "" } else { "s" },
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::layer_list;

    #[test]
    fn held_layers_are_listed_as_runs() {
        assert_eq!(layer_list(&[3]), "layer 3");
        assert_eq!(layer_list(&[1, 2, 3, 7]), "layers 1-3, 7");
        assert_eq!(layer_list(&[1, 3]), "layers 1, 3");
    }
}
