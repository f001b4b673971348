//! `forkfs-core`: every `forkfs` command (the `forkfs` launcher,
//! `main.rs`, runs this binary for all but what a held store answers).

mod cli;
mod home;

fn main() {
    // A store holds every volume's data: what this process creates is its owner's.
    forkfs::restrict_umask();
    // Like other command-line tools: `forkfs log | head` ends quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(cli::run());
}
