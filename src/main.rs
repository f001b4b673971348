//! The `forkfs` command.

mod cli;
mod mount;

fn main() {
    // Like other command-line tools: `forkfs log | head` ends quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(cli::run());
}
