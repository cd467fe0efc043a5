//! `dormouse`: one program for the whole path, train -> export -> generate / serve.
//!
//! This file is glue: the process-wide setup (allocator, kernel threads) and the dispatch.
//! Each subcommand's flags and work live in its own module, `<name>_cmd.rs`.

mod completions;
mod export_cmd;
mod generate_cmd;
mod kernel_threads;
mod plot_cmd;
mod quickstart_cmd;
mod serve_cmd;
mod serve_engine;
mod train_cmd;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

// candle allocates a fresh buffer per tensor op; glibc malloc returns large ones to the
// kernel each time (page faults and zeroing), mimalloc reuses them: nano trains 1.8x faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "dormouse",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUILD_COMMIT"), ")"),
    propagate_version = true,
    about = "Train a small byte-level language model with an Engram memory, export it to one .dmexp file, and generate from it or serve it",
    after_help = "Start with `dormouse quickstart` (about 2 minutes): it trains nano on the embedded corpus,
exports it, explains the export and generates a sample. `dormouse <command> --help` explains
each command with examples."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // Boxed: train's two dozen flags would make every variant that large.
    Train(Box<train_cmd::Args>),
    Export(export_cmd::Args),
    Generate(generate_cmd::Args),
    Serve(serve_cmd::Args),
    Quickstart(quickstart_cmd::Args),
    Plot(plot_cmd::Args),
    /// Prints the shell's completion script for dormouse.
    #[command(after_help = "Examples:
  dormouse completions bash > ~/.local/share/bash-completion/completions/dormouse
  dormouse completions zsh > ~/.zfunc/_dormouse      # with fpath+=(~/.zfunc) in ~/.zshrc
  dormouse completions fish > ~/.config/fish/completions/dormouse.fish")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// Whether the command decodes one byte at a time, where splitting each tiny matrix
    /// product across cores costs more than it gains (see [`kernel_threads`]). Training and
    /// the quickstart's training use every core.
    fn decodes_byte_by_byte(&self) -> bool {
        matches!(self, Command::Generate(_) | Command::Serve(_))
    }

    /// Whether the command trains (see [`kernel_threads::elementwise_on_calling_thread`]).
    fn trains(&self) -> bool {
        matches!(self, Command::Train(_) | Command::Quickstart(_))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command.decodes_byte_by_byte() {
        kernel_threads::single_threaded_kernels();
    } else if cli.command.trains() {
        kernel_threads::elementwise_on_calling_thread();
        // Every step frees and reallocates the same buffers: keep their pages.
        mimalloc_purge::never_purge();
    }
    match cli.command {
        Command::Train(args) => train_cmd::main(*args),
        Command::Export(args) => export_cmd::main(args),
        Command::Generate(args) => generate_cmd::main(args),
        Command::Serve(args) => serve_cmd::main(args),
        Command::Quickstart(args) => quickstart_cmd::main(args),
        Command::Plot(args) => plot_cmd::main(args),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics on a failed write (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "dormouse", &mut script);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            ExitCode::SUCCESS
        }
    }
}
