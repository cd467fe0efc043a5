//! `minirun plan ARTIFACT`: whether a model runs here, and how fast, before a run reads a
//! weight: the floor and its terms, each preset's budget, what a token reads at each, and, where
//! `minirun bench storage` has calibrated the artifact's device, the seconds those reads take.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::{Budget, available_memory, human};
use minirun_stream::plan::{Layers, Mode, Plan};
use serde_json::json;

use crate::bench::storage_calibration as calibration;
use crate::run::Projection;

#[derive(Args)]
pub struct PlanArgs {
    /// The artifact directory (written by `minirun pack` or `minirun download`).
    artifact: PathBuf,
    /// Positions the key/value cache is planned for (default: the model's
    /// max_position_embeddings, at most 4096).
    #[arg(long, value_name = "TOKENS")]
    context: Option<usize>,
    /// Plan every layer's attention, router and shared experts streamed at every budget, as
    /// `minirun run --stream-every-layer` runs them.
    #[arg(long)]
    stream_every_layer: bool,
    /// Plan without verification evidence (nothing is run, but the plan reads the artifact's
    /// metadata and container headers).
    #[arg(long)]
    unverified: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &PlanArgs) -> Result<ExitCode> {
    let trust = match args.unverified {
        true => Trust::Unverified,
        false => Trust::Verified(minirun_store::SealKey::existing_for_user()?),
    };
    let session = Session::open(&args.artifact, trust)?;
    let most = session.architecture.max_positions();
    let context = args.context.unwrap_or(most.min(4096));
    if context > most {
        anyhow::bail!(
            "--context {context} is more than the model's max_position_embeddings {most}"
        );
    }
    let layers = match args.stream_every_layer {
        true => Layers::StreamEvery,
        false => Layers::HoldWhatFits,
    };
    // The floor's plan lists the model's weights; the other presets reuse that list.
    let (floor, weights) = session.plan_layers((Budget::Floor, layers), context)?;
    let mut plans = vec![("floor", floor)];
    for (preset, budget) in [
        ("balanced", Budget::Balanced),
        ("generous", Budget::Generous),
    ] {
        plans.push((
            preset,
            session.plan_for(&weights, (budget, layers), context)?,
        ));
    }
    let found = calibration::for_artifact(&args.artifact);
    let plans: Vec<Planned> = plans
        .into_iter()
        .map(|(preset, plan)| {
            let projection = Projection::with(&plan, found.clone());
            (preset, plan, projection)
        })
        .collect();
    let available = available_memory();
    match args.json {
        true => print_json(args, &session, context, available, &plans),
        false => print_table(&session, context, available, &plans),
    }
    Ok(ExitCode::SUCCESS)
}

type Planned = (&'static str, Plan, Projection);

fn print_json(
    args: &PlanArgs,
    session: &Session,
    context: usize,
    available: Option<u64>,
    plans: &[Planned],
) {
    let budgets: Vec<_> = plans
        .iter()
        .map(|(preset, plan, projection)| {
            json!({
                "preset": preset,
                "budget_bytes": plan.budget,
                "read_bytes_per_token": projection.bytes_per_token,
                "projected_read_seconds_per_token": projection.seconds(),
                "fits_available_memory": available.map(|a| plan.budget <= a),
                "plan": plan,
            })
        })
        .collect();
    let report = json!({
        "artifact": args.artifact.display().to_string(),
        "model": session.architecture.describe(),
        "provenance": session.artifact.provenance,
        "context_tokens": context,
        "available_memory_bytes": available,
        "storage_calibration": plans.first().and_then(|(_, _, p)| p.calibration.as_ref()),
        "budgets": budgets,
    });
    println!("{report}");
}

fn print_table(session: &Session, context: usize, available: Option<u64>, plans: &[Planned]) {
    for line in session.header() {
        println!("{line}");
    }
    println!("a context of {context} tokens");
    if let Some((_, floor, _)) = plans.first() {
        for line in floor.describe() {
            println!("at the floor: {line}");
        }
    }
    println!(
        "{:<10} {:>12} {:<34} {:>14} {:>16}",
        "preset", "budget", "holds", "reads a token", "reads take"
    );
    for (preset, plan, projection) in plans {
        let seconds = projection
            .seconds()
            .map_or("-".to_string(), |s| format!("{s:.3} s/token"));
        println!(
            "{preset:<10} {:>12} {:<34} {:>14} {seconds:>16}",
            human(plan.budget),
            holds(plan),
            human(projection.bytes_per_token),
        );
    }
    match available {
        Some(bytes) => {
            let fits: Vec<&str> = plans
                .iter()
                .filter(|(_, plan, _)| plan.budget <= bytes)
                .map(|(preset, _, _)| *preset)
                .collect();
            let verdict = match fits.as_slice() {
                [] => "none of them fits: it does not run here".to_string(),
                fits => format!("fits now: {}", fits.join(", ")),
            };
            println!("memory available now {}; {verdict}", human(bytes));
        }
        None => println!("this system does not say how much memory is available"),
    }
    if let Some(line) = plans.first().and_then(|(_, _, p)| p.describe()) {
        println!("at the floor, {line}");
    }
}

/// What a plan holds, in a few words.
fn holds(plan: &Plan) -> String {
    match (plan.mode, plan.streamed_layers.len()) {
        (Mode::Resident, _) => "everything".to_string(),
        (Mode::Streamed, 0) => format!("every layer; experts cache {}", human(plan.cache_bytes)),
        (Mode::Streamed, n) => format!(
            "{} of {} layers; experts streamed",
            plan.layer_count - n,
            plan.layer_count
        ),
    }
}
