//! `forkfs-nbd`: serves forkfs block volumes over the NBD protocol.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "forkfs-nbd", version, about = "Serve forkfs block volumes over NBD")]
struct Cli {
    /// Store directory
    #[arg(long, env = "FORKFS_STORE", global = true)]
    store: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve volumes (VOL read-write, VOL@VERSION read-only)
    Serve {
        /// TCP address to listen on
        #[arg(long, default_value = "127.0.0.1:10809")]
        listen: String,
        /// Unix socket to listen on
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Serve only these exports (default: every block volume)
        #[arg(long)]
        export: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { .. } => {
            eprintln!("forkfs-nbd: the NBD server is not built yet (see the NBD server issue)");
            std::process::exit(69);
        }
    }
}
