//! `minirun`: inspect, pack, check, download, verify and run tile-container artifacts.

mod bench;
mod hub;
mod info;
mod pack;
mod plan;
mod quickstart;
mod run;
mod serve;
mod sign;
mod synth;
mod threads;
mod verify;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

// Streamed runs allocate and free tile buffers on many short-lived read threads; glibc's
// per-thread arenas keep freed buffers mapped (a 1 GiB budget ran at 1.37 GiB of RSS), while
// mimalloc returns them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "minirun",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUILD_COMMIT"), ")"),
    about = "Inspect, verify and run quantized tile-container artifacts",
    long_about = "minirun works with artifacts: byte-preserving repacks of quantized upstream checkpoints \
                  into 16 KiB-aligned MNRNTIL1 tile containers, described by an index.json."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole path in one command, on a generated mixture-of-experts model: make a
    /// checkpoint, pack it, sign it with a new key, verify it against the signature, run it at
    /// the floor (a budget several times smaller than its weights) and check its output equals
    /// a fully resident run's; then the commands to try next.
    #[command(after_help = "Examples:
  minirun quickstart
  minirun quickstart --dir /tmp/qs --size-mb 50

Everything goes into --dir (default ./minirun-quickstart); a folder holding anything a quickstart
did not write is refused. Verification evidence is sealed with your evidence key, as `minirun
verify` seals it.

Exit status: 0 done and equal; 1 an error.")]
    Quickstart(quickstart::QuickstartArgs),
    /// Say what a file or artifact is: a tile container's header, an artifact's index.json, or
    /// (for anything else) what the file is and what reads it.
    #[command(after_help = "Examples:
  minirun info layer00/layer00-w1.mxfp4tile
  minirun info layer00/layer00-w1.mxfp4tile --verify-tiles --threads 2
  minirun info ./DeepSeek-V4-Flash-0731-minirun --json

Exit status: 0 described (and every tile verified); 1 an error, a refused container or a
failed tile; 2 a file no minirun or dormouse format recognises.")]
    Info(info::InfoArgs),
    /// Write a synthetic-deterministic MXFP4 tile container (for storage benchmarks and tests):
    /// every byte is recomputable from the seed, so a reader can check it without a digest.
    #[command(after_help = "Example (a 2.1 GB container with tile digests):
  minirun synth --out /tmp/bench.mxfp4tile --rows 2048 --cols 4096 --tiles 482 --digests")]
    Synth(synth::SynthArgs),
    /// Repack an upstream quantized safetensors checkpoint byte for byte into an artifact:
    /// tile containers for quantized matrices, plain streams for everything else, a manifest
    /// with every file's SHA-256 per unit, and index.json.
    #[command(
        after_help = "Recognised upstream layouts: MLX affine and mxfp4 (config.json `quantization`),
gpt-oss MXFP4 (`*_blocks` + `*_scales`), FP8 e4m3 with block scales (`weight_scale_inv`, or
DeepSeek V4's `scale`), DeepSeek V4's FP4 experts (`expert_dtype: fp4`), and unquantized tensors. Anything else that looks quantized is refused, never guessed.

Example:
  minirun pack --source ./Qwen3-MLX-4bit --out ./Qwen3-MLX-4bit-minirun \\
      --source-repo mlx-community/Qwen3-4bit --source-revision <40-hex commit>"
    )]
    Pack(pack::PackArgs),
    /// Compare every packed block, scale, bias and plain stream of an artifact with the source
    /// checkpoint, byte for byte; exits 1 naming the first difference.
    #[command(after_help = "Example:
  minirun check ./Qwen3-MLX-4bit-minirun --source ./Qwen3-MLX-4bit

Exit status: 0 every byte equal; 1 a difference (named) or an error.")]
    Check(pack::CheckArgs),
    /// List an account's published artifacts (repositories named <name>-minirun) with the
    /// commit of each.
    #[command(after_help = "Example:
  minirun catalog --author nanguoyu")]
    Catalog(hub::CatalogArgs),
    /// Download an artifact at a pinned commit: files in parallel, resumable, each hashed while
    /// it is written and placed only when its size and published digest (SHA-256 for LFS files,
    /// git-blob SHA-1 for the rest) match.
    #[command(after_help = "Example:
  minirun download --repo nanguoyu/Kimi-K3-minirun \\
      --revision 159987d3ac437e0aceaff0763d43ddeb549b1842 --out ./Kimi-K3-minirun

The token, if any, comes from $HF_TOKEN and is sent to the endpoint only.")]
    Download(hub::DownloadArgs),
    /// Check an artifact directory against the published tree of a pinned revision (or, with
    /// neither --repo nor --revision, offline against the SHA-256s its own unit manifests
    /// record): every file's size and digest, opened beneath the directory without following
    /// links, re-checked after hashing. Success writes evidence (DIR/.minirun/evidence.json)
    /// bound to the files; a killed pass resumes from its per-file checkpoint.
    #[command(after_help = "Examples:
  minirun verify ./Kimi-K3-minirun --repo nanguoyu/Kimi-K3-minirun \\
      --revision 159987d3ac437e0aceaff0763d43ddeb549b1842
  minirun verify ./art --repo team/x-minirun --revision <sha> --tree saved-tree.json
  minirun verify ./packed-artifact                      # offline, its own manifests
  minirun verify ./art --repo ... --revision ... --spot-check 2000000000
  minirun verify ./signed-artifact --allowed-signers allowed_signers   # offline, its publisher's signature

Exit status: 0 verified (evidence written); 1 a mismatch or an error (evidence erased).")]
    Verify(verify::VerifyArgs),
    /// Sign an artifact as its publisher: a statement of the SHA-256 of every file that is not
    /// payload (index.json, unit manifests, config, tokenizer and template files; payload is
    /// covered by the manifests' own digests) and the artifact's identity, with a detached SSH
    /// signature beside it (the sshsig format of `ssh-keygen -Y sign`). Reads metadata only.
    #[command(after_help = "Examples:
  minirun sign ./tiny-minirun --key ~/.ssh/id_ed25519
  minirun verify ./tiny-minirun --allowed-signers allowed_signers   # anyone, offline

The statement is minirun-statement.txt and the signature minirun-statement.txt.sig, both at the
artifact's root, in the namespace minirun-artifact (docs/formats/signed-statement.md).")]
    Sign(sign::SignArgs),
    /// Say whether a model runs here and how fast, before a run reads a weight: the floor and
    /// its terms, the budget of each preset (floor, balanced, generous), the bytes a token reads
    /// at each, which fit the memory available now, and, where `minirun bench storage` has
    /// calibrated the artifact's device, the seconds those reads take a token.
    #[command(after_help = "Examples:
  minirun plan ./DeepSeek-V4-Flash-minirun
  minirun plan ./Kimi-K3-minirun --context 8192 --stream-every-layer --json

Exit status: 0 planned; 1 an error (a refused artifact or config).")]
    Plan(plan::PlanArgs),
    /// Generate text from an artifact's model under a memory budget, computing straight from
    /// the stored quantized bytes: resident, or with its routed experts (and, below the
    /// deterministic floor, its layers) streamed from storage, with the same output bits at
    /// every budget.
    #[command(
        long_about = run_long_about(),
        after_help = "The artifact must carry verification evidence (run `minirun verify` first) unless
--unverified is given; then every line of the output header says UNVERIFIED.

Text streams to standard output; the header and the figures (tokens/s, bytes of weights read
per token) go to standard error. --json prints one JSON object instead.

--budget sets the memory the run may use (2GiB, 500MB, or floor/balanced/generous). The plan
(what is resident, what streams, the floor and the expert cache) is printed first; a budget
below the floor is refused before a weight is read.

Examples:
  minirun run ./tiny-minirun --prompt \"The clockmaker\" --max-tokens 32
  minirun run ./big-minirun --prompt \"Hello\" --budget 1GiB --trace steps.jsonl
  minirun run ./tiny-minirun --prompt \"Count to three.\" --chat --temperature 0.7 --top-p 0.9 --seed 7
  minirun run ./tiny-minirun --prompt \"Hello\" --unverified --json

Exit status: 0 generated; 1 an error (a refused artifact, config or prompt)."
    )]
    Run(run::RunArgs),
    /// Serve an artifact over an OpenAI-compatible HTTP API, decoding concurrent requests as
    /// one batch under a memory budget.
    #[command(
        after_help = "Routes: GET /health, GET /v1/models, POST /v1/completions and POST /v1/chat/completions
(the artifact's chat template), each with stream: true for server-sent events. See docs/serve.md.

Requests being answered decode together: one step runs every one of them, so each weight (and
each streamed layer or expert) is read once per step for all, and each request gets exactly
the tokens `minirun run` gives it alone. --budget is planned for the caches of
--max-concurrent requests of --context tokens.

Examples:
  minirun serve ./tiny-minirun --port 8000
  minirun serve ./big-minirun --budget 2GiB --max-concurrent 8 --context 2048
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 32}'

Exit status: 0 stopped on SIGTERM or Ctrl-C; 1 an error (a refused artifact, budget or address)."
    )]
    Serve(serve::ServeArgs),
    /// Benchmarks of what minirun's reads get from this machine.
    #[command(
        subcommand,
        after_help = "Examples:
  minirun bench storage ./DeepSeek-V4-Flash-minirun
  minirun bench model ./tiny-minirun --unverified
  minirun bench memory --threads 2"
    )]
    Bench(bench::BenchCommand),
    /// Prints the shell's completion script for minirun.
    #[command(after_help = "Examples:
  minirun completions bash > ~/.local/share/bash-completion/completions/minirun
  minirun completions zsh > ~/.zfunc/_minirun        # with fpath+=(~/.zfunc) in ~/.zshrc
  minirun completions fish > ~/.config/fish/completions/minirun.fish")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// The command's `--threads`, for commands that work in parallel.
    fn threads(&self) -> Option<threads::Threads> {
        match self {
            Command::Info(a) => Some(a.threads),
            Command::Pack(a) => Some(a.threads),
            Command::Check(a) => Some(a.threads),
            Command::Verify(a) => Some(a.threads),
            Command::Run(a) => Some(a.threads),
            Command::Serve(a) => Some(a.threads),
            Command::Bench(c) => c.threads(),
            Command::Synth(_)
            | Command::Catalog(_)
            | Command::Download(_)
            | Command::Sign(_)
            | Command::Plan(_)
            | Command::Quickstart(_)
            | Command::Completions { .. } => None,
        }
    }
}

fn main() -> ExitCode {
    // Before any thread starts: a budget is kept in pages touched, not in 2 MiB pages, and
    // memory freed goes back at once, not a second later beside what replaced it.
    let _ = minirun_stream::budget::count_only_used_pages();
    mimalloc_purge::purge_at_once();
    let cli = Cli::parse();
    if let Some(threads) = cli.command.threads()
        && let Err(err) = threads::init(threads)
    {
        eprintln!("minirun: {}", error_line::one_line(&err));
        return ExitCode::from(1);
    }
    let result = match cli.command {
        Command::Info(args) => info::run(&args),
        Command::Synth(args) => synth::run(&args),
        Command::Pack(args) => pack::pack(&args),
        Command::Check(args) => pack::check(&args),
        Command::Catalog(args) => hub::catalog(&args),
        Command::Download(args) => hub::download(&args),
        Command::Verify(args) => verify::run(&args),
        Command::Sign(args) => sign::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Quickstart(args) => threads::on_pool(|| quickstart::run(&args)),
        Command::Run(args) => threads::on_pool(|| run::run(&args)),
        Command::Serve(args) => serve::serve(&args),
        Command::Bench(command) => bench::run(&command),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics on a failed write (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "minirun", &mut script);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("minirun: {}", error_line::one_line(&err));
            ExitCode::from(1)
        }
    }
}

/// A path argument, for messages.
pub(crate) fn shown(path: &std::path::Path) -> String {
    dmexp::identify::printable(&path.display().to_string()).into_owned()
}

/// `minirun run --help`'s description, naming every architecture the registry runs.
fn run_long_about() -> String {
    format!(
        "Generate text from an artifact's model under a memory budget, computing straight from the stored quantized bytes: resident, or with its routed experts (and, below the deterministic floor, its layers) streamed from storage, with the same output bits at every budget.\n\nArchitectures (config.json's model_type): {}.",
        minirun_runtime::registry::known_model_types()
    )
}
