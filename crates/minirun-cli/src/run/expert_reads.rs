//! `--reads-in-flight` and `--guessed-layers`: how a streamed run reads its routed experts, one
//! meaning in `minirun run`, `minirun serve` and `minirun bench model`.

use clap::Args;
use minirun_runtime::RunRequest;
use minirun_stream::budget::Budget;
use minirun_stream::plan::{DEFAULT_READS_IN_FLIGHT, GUESSED_LAYERS};

#[derive(Args, Debug, Clone, Copy)]
pub struct ExpertReads {
    /// Expert reads in flight at once in a streamed run (1-64). `minirun bench storage DIR`
    /// shows the queue depth where the storage is fastest.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_READS_IN_FLIGHT as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub reads_in_flight: u16,
    /// Streamed MoE layers whose experts a decode step may read ahead on a guess at once
    /// (0-2): their routers applied to the row's state a layer or two early, the guessed
    /// experts read while the layers before them compute. A wrong guess costs its read, never
    /// a result. Each guessed layer takes a slot pool from the expert cache; where the budget
    /// has no room for one (as at the floor) nothing is guessed. 0 reads only what a router
    /// chose.
    #[arg(long, value_name = "N", default_value_t = GUESSED_LAYERS as u8,
          value_parser = clap::value_parser!(u8).range(0..=2))]
    pub guessed_layers: u8,
}

impl ExpertReads {
    /// A run of `budget` and `context_tokens` reading as these say, every other setting the
    /// default.
    pub fn request(self, budget: Option<Budget>, context_tokens: usize) -> RunRequest {
        RunRequest {
            reads_in_flight: usize::from(self.reads_in_flight),
            guessed_layers: usize::from(self.guessed_layers),
            ..RunRequest::new(budget, context_tokens)
        }
    }
}
