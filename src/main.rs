//! The `forkfs` command.

mod cli;
mod mount;

fn main() {
    std::process::exit(cli::run());
}
