//! Which processes use a mount (as `fuser -m` says): their working or
//! root directory, an open file or a mapped file is under it. Read from
//! `/proc` by link name only, so a hung mount cannot block the search.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// (pid, command name) of every process using something under `dir`,
/// this one included.
pub fn users_of(dir: &Path) -> Vec<(u32, String)> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if uses(&p.path(), dir) {
            let name = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            out.push((pid, name.trim().to_string()));
        }
    }
    out.sort();
    out
}

fn uses(proc_dir: &Path, dir: &Path) -> bool {
    let under = |link: &Path| std::fs::read_link(link).is_ok_and(|t| t.starts_with(dir));
    if ["cwd", "root", "exe"].iter().any(|l| under(&proc_dir.join(l))) {
        return true;
    }
    if let Ok(fds) = std::fs::read_dir(proc_dir.join("fd"))
        && fds.flatten().any(|fd| under(&fd.path()))
    {
        return true;
    }
    // Mapped files: the path is the last field of a maps line.
    let prefix = dir.as_os_str().as_bytes();
    std::fs::read(proc_dir.join("maps")).is_ok_and(|maps| {
        maps.split(|&b| b == b'\n').any(|line| {
            line.iter().position(|&b| b == b'/').is_some_and(|at| {
                let path = &line[at..];
                path.starts_with(prefix)
                    && (path.len() == prefix.len() || path[prefix.len()] == b'/')
            })
        })
    })
}
