//! What a write, a truncation, a copy and a change of owner take from a
//! file, judged against ext4 in the same test: set-user-ID, set-group-ID
//! with group execute, and file capabilities. The mount kills them itself
//! (FUSE_HANDLE_KILLPRIV_V2), so the kernel no longer asks for
//! security.capability before every write.

use crate::common::mount::{Mounted, assert_shows, new_store, require_tool, run, script_lines};
use std::path::Path;
use std::process::Command;

/// One line per step: the file's mode, and whether it has capabilities.
const STEPS: &str = r#"
set -e
as_nobody() { su nobody -s /bin/sh -c "$1"; }
caps() { python3 -c 'import os,sys; print("caps" if "security.capability" in os.listxattr(sys.argv[1]) else "none")' "$1"; }
# A capability set (revision 2, CAP_CHOWN permitted): 20 bytes.
setcaps() { python3 -c 'import os,sys; os.setxattr(sys.argv[1], "security.capability", bytes([0,0,0,2, 1,0,0,0, 0,0,0,0, 0,0,0,0, 0,0,0,0]))' "$1"; }
mk() { echo data > "$1"; chmod "$2" "$1"; }
show() { echo "$1: $(stat -c %a "$2") $(caps "$2")"; }
chmod 777 .
mk w 6777;  as_nobody 'echo more >> w';  show "nobody writes" w
mk t 6777;  as_nobody 'truncate -s 2 t'; show "nobody truncates" t
mk fa 6777; as_nobody 'fallocate -l 1M fa'; show "nobody fallocates" fa
mk c 6777;  echo source > src; chmod 644 src
as_nobody 'python3 -c "import os; s=os.open(\"src\", os.O_RDONLY); d=os.open(\"c\", os.O_WRONLY); os.copy_file_range(s, d, 7, 0, 0)"'
show "nobody copies into" c
mk r 6777;  echo more >> r;             show "root writes" r
mk o 6755;  chown nobody o;             show "root gives away" o
mk g 6750;  chgrp nogroup g;            show "root changes the group" g
mk k 755;   setcaps k; show "capabilities set" k
echo more >> k;                         show "root writes a file with capabilities" k
mk kt 755;  setcaps kt; truncate -s 1 kt; show "root truncates a file with capabilities" kt
mk d 2767;  as_nobody 'echo more >> d';  show "nobody writes set-group-ID without group execute" d
"#;

fn story(dir: &Path) -> Vec<String> {
    script_lines(STEPS, dir)
}

#[test]
fn writes_truncations_copies_and_chown_kill_privileges_as_on_ext4() {
    for tool in ["su", "truncate", "fallocate", "python3"] {
        require_tool(tool);
    }
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "killpriv", &[]);
    let ext4 = crate::common::mount::ext4_reference_dir();
    let native = story(ext4.path());
    // The reference behaves as the steps expect, so a mount that matches
    // it kills what Linux kills.
    assert_shows(
        &native,
        &[
            "nobody writes: 777 none",
            "nobody truncates: 777 none",
            "nobody fallocates: 777 none",
            "nobody copies into: 777 none",
            "root writes: 6777 none",
            "root gives away: 755 none",
            "root changes the group: 750 none",
            "capabilities set: 755 caps",
            "root writes a file with capabilities: 755 none",
            "root truncates a file with capabilities: 755 none",
        ],
    );
    let mounted = story(m.dir());
    // Set-group-ID without group execute (once mandatory locking's mark):
    // ext4 takes it from a writer outside the file's group; the FUSE
    // protocol leaves it (the kernel does not say who is in the group).
    let last = |s: &[String]| s.last().cloned().unwrap_or_default();
    assert_eq!(
        mounted[..mounted.len() - 1],
        native[..native.len() - 1],
        "the same steps on ext4 and in the mount"
    );
    assert_eq!(last(&native), "nobody writes set-group-ID without group execute: 767 none");
    assert_eq!(last(&mounted), "nobody writes set-group-ID without group execute: 2767 none");
    // What was killed is stored, not only shown by the kernel.
    let m = m.remount();
    assert_eq!(story_stat(m.dir()), story_stat(ext4.path()));
}

/// The modes of the files the steps left, read again.
fn story_stat(dir: &Path) -> String {
    run(Command::new("stat")
        .args(["-c", "%n %a", "w", "t", "fa", "c", "r", "o", "g", "k", "kt"])
        .current_dir(dir))
}
