//! What a model's layers ask for, recorded by running its builder dry (see
//! [`crate::weights`]): the planner's input, and the streamed layers' read lists and tables.

use crate::artifact::StackLayout;
use crate::experts::ExpertParts;
use crate::tables::RecordedTable;

/// Every MoE layer's routed experts, by layer (`None` for a dense layer).
pub type ExpertMap = Vec<Option<Vec<ExpertParts>>>;

/// What one layer asked for, recorded.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The matrices every token reads (attention, router, shared experts or the dense MLP):
    /// what a streamed layer reads for each step.
    pub matrices: Vec<StackLayout>,
    /// Its routed experts; `None` for a dense layer.
    pub experts: Option<Vec<ExpertParts>>,
}

/// What every layer of a model asks for, recorded by running its builder dry: the planner's
/// input, and the streamed layers' read lists.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub layers: Vec<LayerWeights>,
    /// The tables outside the layers (the token embedding, the output head; one table where
    /// they are tied), which the plan may leave on storage and read by rows.
    pub tables: Vec<RecordedTable>,
}

impl ModelWeights {
    /// Where every MoE layer's routed experts are (`None` for a dense layer).
    pub fn expert_map(&self) -> ExpertMap {
        self.layers.iter().map(|l| l.experts.clone()).collect()
    }

    /// Layer `layer`'s deterministic matrices.
    pub fn matrices(&self, layer: usize) -> &[StackLayout] {
        self.layers.get(layer).map_or(&[], |l| &l.matrices)
    }
}
