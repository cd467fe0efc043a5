//! `minirun quickstart`: the whole path in one command, on a generated mixture-of-experts model.
//! Makes a DeepSeek-V3-shaped checkpoint of random weights, packs it, signs it with a key it
//! makes, verifies it against that signature, runs it at the floor (a budget several times
//! smaller than its weights) with the plan and the instruments printed, checks that the floor's
//! output has the bits of a fully resident run, and ends with the commands to try next.
//! Everything goes into one folder; a folder holding anything else is refused, never emptied.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use minirun_pack::PackOptions;
use minirun_runtime::{Generation, RunRequest, Sampling, Session, Trust};
use minirun_store::SealKey;
use minirun_stream::budget::{Budget, human};
use minirun_synth::tiny_models::{SyntheticShape, write_synthetic_deepseek};

use crate::shown;

#[derive(Args)]
pub struct QuickstartArgs {
    /// The folder everything goes into (made if missing; refused if it holds anything a
    /// quickstart did not write).
    #[arg(long, default_value = "minirun-quickstart")]
    dir: PathBuf,
    /// The generated checkpoint's size in MB (its routed experts; 200 MB writes, packs and runs
    /// in well under a minute on 2 cores in a release build).
    #[arg(long, value_name = "MB", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    size_mb: u32,
    /// Tokens generated at the floor and resident.
    #[arg(long, default_value_t = 24)]
    tokens: usize,
}

/// Marks a folder as a quickstart's, so that a rerun may replace what the last one wrote.
const MARKER: &str = ".minirun-quickstart";
/// What a quickstart writes in its folder, and a rerun replaces.
const WRITTEN: [&str; 6] = [
    MARKER,
    "tokenizer",
    "checkpoint",
    "artifact",
    "signing-key",
    "allowed_signers",
];
const PROMPT: &str = "The clockmaker";
const PRINCIPAL: &str = "quickstart@minirun";

/// The tokenizer the generated checkpoint carries (a byte-level BPE of a few hundred tokens;
/// the model's outputs mean nothing, so its text is only for show).
const TOKENIZER: [(&str, &str); 3] = [
    (
        "tokenizer.json",
        include_str!("../../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_str!(
            "../../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64/tokenizer_config.json"
        ),
    ),
    (
        "special_tokens_map.json",
        include_str!(
            "../../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64/special_tokens_map.json"
        ),
    ),
];

pub fn run(args: &QuickstartArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let dir = &args.dir;
    claim_folder(dir)?;
    let (checkpoint, artifact) = (dir.join("checkpoint"), dir.join("artifact"));
    let shape = shape_of(args.size_mb);
    step(1, "generating", || {
        write_checkpoint(dir, &checkpoint, &shape)
    })?;
    println!(
        "    {} layers ({} MoE) of {} experts, {} per token, {} of routed experts, random weights",
        shape.layers,
        shape.layers - 1,
        shape.experts,
        shape.experts_per_token,
        human(shape.expert_bytes() * (shape.experts * (shape.layers - 1)) as u64),
    );
    pack(&checkpoint, &artifact)?;
    let allowed = step(3, "signing with a new key", || sign(dir, &artifact))?;
    step(4, "verifying against the signature", || {
        verify(&artifact, &allowed)
    })?;
    let (floor, resident) = run_both(&artifact, args.tokens)?;
    if floor.generated_ids != resident.generated_ids
        || floor.figures.logits_sha256_hex() != resident.figures.logits_sha256_hex()
    {
        bail!(
            "the floor's run differs from the resident run (logits {} vs {}): this is a bug, please report it",
            floor.figures.logits_sha256_hex(),
            resident.figures.logits_sha256_hex()
        );
    }
    println!(
        "6/6 the floor's {} tokens and every logit equal the resident run's (logits SHA-256 {})",
        floor.generated_ids.len(),
        floor.figures.logits_sha256_hex()
    );
    println!(
        "done in {:.1} s; everything is in {}",
        started.elapsed().as_secs_f64(),
        shown(dir)
    );
    let a = shown(&artifact);
    let next = [
        (
            format!("minirun serve {a} --budget floor"),
            "the page and the API, at the address it prints",
        ),
        (
            format!("minirun run {a} --prompt \"{PROMPT}\" --budget balanced"),
            "more held, fewer reads a token",
        ),
        (
            format!("minirun plan {a}"),
            "every preset's budget and reads",
        ),
    ];
    let width = next
        .iter()
        .map(|(command, _)| command.len())
        .max()
        .unwrap_or(0);
    println!("next:");
    for (command, what) in next {
        println!("  {command:<width$}   # {what}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A step that shows a spinner while it works, and says how long it took once it succeeded.
fn step<T>(n: usize, what: &str, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let spinner = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    spinner.set_message(format!("{n}/6 {what}"));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let started = Instant::now();
    let done = work()?;
    spinner.finish_and_clear();
    println!("{n}/6 {what} ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(done)
}

/// Makes `dir`, or takes it over when it is empty or a quickstart's: what a quickstart wrote
/// there is removed (nothing else ever is); anything else in it refuses the run.
fn claim_folder(dir: &Path) -> Result<()> {
    if !dir.exists() {
        fs::create_dir_all(dir).with_context(|| format!("cannot make {}", shown(dir)))?;
    }
    let entries: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", shown(dir)))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", shown(dir)))?;
    let ours = entries.iter().any(|e| e == MARKER);
    if let Some(other) = entries
        .iter()
        .find(|e| !ours || !WRITTEN.contains(&e.as_str()))
    {
        bail!(
            "{} holds {other}, which a quickstart did not write: give an empty or new folder with --dir",
            shown(dir)
        );
    }
    for name in WRITTEN.iter().filter(|n| entries.iter().any(|e| e == *n)) {
        let path = dir.join(name);
        let removed = match path.is_dir() {
            true => fs::remove_dir_all(&path),
            false => fs::remove_file(&path),
        };
        removed.with_context(|| format!("cannot remove the last quickstart's {}", shown(&path)))?;
    }
    atomic_file::write_bytes(&dir.join(MARKER), b"a minirun quickstart's folder\n")?;
    Ok(())
}

/// A DeepSeek-V3-shaped checkpoint of about `size_mb` MB of routed experts: 32 experts of
/// hidden 512 and width 1024 a layer (every expert tile page-aligned), 4 per token.
fn shape_of(size_mb: u32) -> SyntheticShape {
    let mut shape = SyntheticShape {
        hidden: 512,
        layers: 2,
        experts: 32,
        experts_per_token: 4,
        moe_intermediate: 1024,
        vocab: 512,
        seed: 42,
    };
    let per_layer = shape.expert_bytes() * shape.experts as u64;
    let bytes = u64::from(size_mb) * 1_000_000;
    shape.layers = 1 + bytes.div_ceil(per_layer).max(1) as usize;
    shape
}

fn write_checkpoint(dir: &Path, checkpoint: &Path, shape: &SyntheticShape) -> Result<()> {
    let tokenizer = dir.join("tokenizer");
    fs::create_dir_all(&tokenizer)?;
    for (name, text) in TOKENIZER {
        atomic_file::write_bytes(&tokenizer.join(name), text.as_bytes())?;
    }
    write_synthetic_deepseek(checkpoint, shape, &tokenizer)
        .with_context(|| format!("cannot write the checkpoint into {}", shown(checkpoint)))
}

fn pack(checkpoint: &Path, artifact: &Path) -> Result<()> {
    let bar = crate::pack::bytes_bar(checkpoint);
    let started = Instant::now();
    let summary = minirun_pack::pack(checkpoint, artifact, &PackOptions::default(), &|n| {
        bar.inc(n)
    })
    .with_context(|| format!("cannot pack {}", shown(checkpoint)))?;
    bar.finish_and_clear();
    println!(
        "2/6 packing ({:.1} s): {} payload files, {} byte for byte into tile containers",
        started.elapsed().as_secs_f64(),
        summary.payload_files,
        human(summary.payload_bytes)
    );
    Ok(())
}

/// Makes an Ed25519 key and its allowed-signers file in `dir`, and signs the artifact with it;
/// returns the allowed-signers file.
fn sign(dir: &Path, artifact: &Path) -> Result<PathBuf> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no random source for a key: {e}"))?;
    let key = minirun_sign::ed25519_key(&seed, PRINCIPAL)?;
    let (private, allowed) = (dir.join("signing-key"), dir.join("allowed_signers"));
    let owner_only = atomic_file::Options::private();
    atomic_file::write_bytes_with(&private, owner_only, key.private_openssh.as_bytes())?;
    atomic_file::write_bytes(&allowed, key.allowed_signers_line.as_bytes())?;
    crate::sign::sign_artifact(artifact, &private)?;
    Ok(allowed)
}

fn verify(artifact: &Path, allowed: &Path) -> Result<()> {
    let key = SealKey::for_user()?;
    let status = crate::verify::signed::verify(artifact, allowed, &key)?;
    match status == ExitCode::SUCCESS {
        true => Ok(()),
        false => bail!("{} did not verify against its signature", shown(artifact)),
    }
}

/// The model greedy at the floor, its plan and instruments printed, then fully resident.
fn run_both(artifact: &Path, tokens: usize) -> Result<(Generation, Generation)> {
    let key = SealKey::existing_for_user()?;
    let mut session = Session::open(artifact, Trust::Verified(key))?;
    let prompt = session.prompt_ids(PROMPT, false)?;
    let context = prompt.len() + tokens;
    let mut generate = |budget: Budget| -> Result<(Generation, Vec<String>, u64)> {
        let run = session.plan_request(&RunRequest::new(Some(budget), context))?;
        let model = session.run_model(&run)?;
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        };
        let generation = session.generate(&model, &prompt, tokens, greedy, &[], |_| {})?;
        Ok((generation, run.plan.describe(), run.plan.everything))
    };
    let started = Instant::now();
    let (floor, plan, everything) = generate(Budget::Floor)?;
    println!(
        "5/6 running at the floor ({:.1} s), {tokens} tokens of \"{PROMPT}\":",
        started.elapsed().as_secs_f64()
    );
    for line in plan {
        println!("    {line}");
    }
    let f = &floor.figures;
    println!(
        "    everything resident would take {}; {:.1} tokens/s, {} of weights read a token ({} of experts, {} of layers), {:.2} of {:.2} s waiting for reads",
        human(everything),
        f.tokens_per_second(),
        human(f.weight_bytes_per_token()),
        human(f.expert_read_bytes_per_token()),
        human(f.layer_read_bytes_per_token()),
        f.decode_io.io_time.as_secs_f64(),
        f.decode_time.as_secs_f64()
    );
    println!(
        "    text (random weights, so it means nothing): {:?}",
        floor.text
    );
    let (resident, _, _) = generate(Budget::Generous)?;
    Ok((floor, resident))
}
