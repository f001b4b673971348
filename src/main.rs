//! The `forkfs` command.

mod cli;

fn main() {
    // A store holds every volume's data: what this process creates is its owner's.
    forkfs::restrict_umask();
    // Like other command-line tools: `forkfs log | head` ends quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(cli::run());
}
