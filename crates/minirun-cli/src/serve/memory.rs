//! The memory dial of `minirun serve` (`GET /api/memory`): the plan the server runs and what
//! the other budgets would hold, made by the same planner before the server starts. The budget
//! of a running server is fixed (its model was loaded for it), so the dial says what another
//! budget would do and the command that runs it; it never claims to change this one.

use minirun_runtime::Session;
use minirun_stream::budget::Budget;
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Layers, Mode, Plan};
use serde::Serialize;

const HOW_TO_CHANGE: &str = "The budget is fixed when the server starts, because the model was loaded for it: stop the server and start it again with the command shown.";

/// `GET /api/memory`.
#[derive(Debug, Clone, Serialize)]
pub struct Dial {
    pub running_budget: u64,
    /// Always false: see the module's note.
    pub can_change: bool,
    pub how_to_change: &'static str,
    /// Memory free when the server started, where the system says.
    pub available_memory: Option<u64>,
    pub floor: u64,
    pub everything: u64,
    /// By budget, ascending; one is the running plan.
    pub plans: Vec<DialPlan>,
}

/// What one budget would hold.
#[derive(Debug, Clone, Serialize)]
pub struct DialPlan {
    pub label: String,
    pub budget: u64,
    pub running: bool,
    pub mode: &'static str,
    pub resident_bytes: u64,
    pub held_bytes: u64,
    pub cache_bytes: u64,
    pub slot_pool_bytes: u64,
    pub layer_pool_bytes: u64,
    /// Buffers for the embedding's and head's rows read from storage.
    pub table_pool_bytes: u64,
    pub reserve_bytes: u64,
    pub streamed_layers: usize,
    pub layer_count: usize,
    pub held_layers: usize,
    pub moe_layers: usize,
    /// Bytes a token reads from storage when the expert cache holds none of what it needs.
    pub read_per_token: u64,
    /// The tables read by rows from storage (`the head (lm_head.weight)`).
    pub tables_streamed: Vec<String>,
    /// What the budget holds first, in words (empty for a resident run).
    pub ranking: String,
    /// Starts a server with this budget.
    pub command: String,
}

/// The dial for a server running `running` (planned from `weights`), planned for
/// `context_tokens` like it.
pub fn dial(
    session: &Session,
    weights: &ModelWeights,
    running: &Plan,
    context_tokens: usize,
    artifact: &str,
    available_memory: Option<u64>,
) -> Dial {
    let presets = [
        ("floor", Budget::Floor),
        (
            "attention and routers resident",
            Budget::Bytes(running.deterministic_floor),
        ),
        ("balanced", Budget::Balanced),
        ("generous", Budget::Generous),
    ];
    let mut plans = vec![entry("running", running, true, artifact)];
    for (label, budget) in presets {
        // A preset the planner refuses (none should: each is at or above the floor) is left
        // off the dial rather than shown with made-up figures.
        if let Ok(plan) = session.plan_for(weights, (budget, Layers::HoldWhatFits), context_tokens)
            && plans.iter().all(|p| p.budget != plan.budget)
        {
            plans.push(entry(label, &plan, false, artifact));
        }
    }
    plans.sort_by_key(|p| p.budget);
    Dial {
        running_budget: running.budget,
        can_change: false,
        how_to_change: HOW_TO_CHANGE,
        available_memory,
        floor: running.floor,
        everything: running.everything,
        plans,
    }
}

fn entry(label: &str, plan: &Plan, running: bool, artifact: &str) -> DialPlan {
    DialPlan {
        label: label.to_string(),
        budget: plan.budget,
        running,
        mode: match plan.mode {
            Mode::Resident => "resident",
            Mode::Streamed => "streamed",
        },
        resident_bytes: plan.resident_bytes,
        held_bytes: plan.held_bytes,
        cache_bytes: plan.cache_bytes,
        slot_pool_bytes: plan.slot_pool_bytes,
        layer_pool_bytes: plan.layer_pool_bytes,
        table_pool_bytes: plan.table_pool_bytes,
        reserve_bytes: plan.reserve_bytes,
        streamed_layers: plan.streamed_layers.len(),
        layer_count: plan.layer_count,
        held_layers: plan.held_layers.len(),
        moe_layers: plan.moe_layers,
        read_per_token: plan.read_per_token(),
        tables_streamed: plan.stored_table_labels(),
        ranking: plan.ranking_line(),
        command: format!("minirun serve {artifact} --budget {}", plan.budget),
    }
}
