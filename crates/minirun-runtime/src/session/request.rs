//! The one front door a program runs a model through: a [`RunRequest`] says what the run may
//! use and how it reads; the session turns it into a [`PlannedRun`] (the plan with the weights
//! it was made from), and that into a model. `minirun run`, `minirun serve` and `minirun bench
//! model` each build one request, so that a flag means the same in all three.

use minirun_kernels::Activations;
use minirun_stream::budget::{Budget, available_memory};
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{DEFAULT_READS_IN_FLIGHT, GUESSED_LAYERS, Layers, Plan};

use crate::engine::model::Model;
use crate::session::{Session, SessionError};

/// What a program asks of a run.
#[derive(Debug, Clone, Copy)]
pub struct RunRequest {
    /// The memory the run may use; `None` for everything resident, refused when that is more
    /// than the memory available now.
    pub budget: Option<Budget>,
    /// Whether layers the budget could hold are held, or every layer streams.
    pub layers: Layers,
    /// Positions the key/value caches are planned for (every sequence's together).
    pub context_tokens: usize,
    /// Reads of a streamed run in flight at once.
    pub reads_in_flight: usize,
    /// Streamed MoE layers whose experts a decode step may read ahead on a guess.
    pub guessed_layers: usize,
    /// The arithmetic of every product.
    pub activations: Activations,
}

impl RunRequest {
    /// A request for `budget` and `context_tokens`, every other setting the default: layers
    /// held where the budget allows, the default reads, exact (f32) arithmetic.
    pub fn new(budget: Option<Budget>, context_tokens: usize) -> RunRequest {
        RunRequest {
            budget,
            layers: Layers::HoldWhatFits,
            context_tokens,
            reads_in_flight: DEFAULT_READS_IN_FLIGHT,
            guessed_layers: GUESSED_LAYERS,
            activations: Activations::F32,
        }
    }
}

/// A plan, and what the model's layers ask for (the plan's input, and a streamed layer's read
/// list).
pub struct PlannedRun {
    pub plan: Plan,
    pub weights: ModelWeights,
}

impl Session {
    /// The run `request` asks for, planned before any payload byte is read: the artifact's
    /// arithmetic set, the budget refused below the floor (or, when none was given, beyond the
    /// memory available), the reads set on the plan.
    pub fn plan_request(&mut self, request: &RunRequest) -> Result<PlannedRun, SessionError> {
        self.artifact.set_activations(request.activations);
        let dial = (request.budget, request.layers);
        let (mut plan, weights) =
            self.plan_within(dial, request.context_tokens, available_memory())?;
        plan.reads_in_flight = request.reads_in_flight;
        plan.guess_ahead(request.guessed_layers);
        Ok(PlannedRun { plan, weights })
    }

    /// The model `run` plans: resident, or with layers and experts streamed.
    pub fn run_model(&self, run: &PlannedRun) -> Result<Model<'_>, SessionError> {
        self.planned_model(&run.plan, &run.weights)
    }
}
