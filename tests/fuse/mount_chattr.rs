//! Inode flags in the mount (`chattr`, `lsattr`), judged against ext4 in
//! the same test: an immutable file or directory refuses every change, an
//! append-only one only grows, and the flags persist.

use crate::common::mount::{Mounted, assert_shows, new_store, require_tool, run, script_lines};
use std::path::Path;
use std::process::Command;

/// The same steps in `dir`, one line each: "ok" or the error the tool
/// printed (strerror text, the same on every filesystem).
const STEPS: &str = r#"
step() { label=$1; shift; if out=$("$@" 2>&1); then echo "$label: ok"; else echo "$label: ${out##*: }"; fi; }
flags() { echo "$1 flags: $(lsattr -d "$1" | awk '{print $1}' | tr -cd 'iadA')"; }
setx() { python3 -c '
import os, sys
try: os.setxattr(sys.argv[1], "user.x", b"1")
except OSError as e: sys.exit(e.strerror)' "$1"; }
echo data > f; mkdir d; echo x > d/g
chattr +i f; flags f
step "append to immutable" sh -c 'echo more >> f'
step "truncate immutable" truncate -s 0 f
step "chmod immutable" chmod 600 f
step "setxattr immutable" setx f
step "remove immutable" rm -f f
step "rename immutable" mv f f2
step "link immutable" ln f f3
step "read immutable" cat f
chattr -i f; flags f
step "append after -i" sh -c 'echo more >> f'
chattr +a f; flags f
step "append to append-only" sh -c 'echo more >> f'
step "overwrite append-only" sh -c 'echo new > f'
step "truncate append-only" truncate -s 0 f
step "chmod append-only" chmod 600 f
step "remove append-only" rm -f f
step "rename append-only" mv f f2
step "touch append-only" touch f
step "touch append-only to a chosen time" touch -d '2020-01-01' f
step "fallocate append-only" fallocate -l 1M f
step "punch a hole in append-only" fallocate -p -o 0 -l 4096 f
cat f
chattr -a f
chattr +i d; flags d
step "create in immutable dir" touch d/new
step "remove from immutable dir" rm -f d/g
step "rename in immutable dir" mv d/g d/h
step "append to a file in an immutable dir" sh -c 'echo y >> d/g'
chattr -i d; chattr +a d; flags d
step "create in append-only dir" touch d/new
step "remove from append-only dir" rm -f d/new
step "rename in append-only dir" mv d/g d/h
chattr -a d
chattr +d +A f; flags f
chattr =i f
echo theirs > own; chown nobody own
step "another user sets +i on its own file" su nobody -s /bin/sh -c 'chattr +i own'
step "another user sets +d on its own file" su nobody -s /bin/sh -c 'chattr +d own'
step "another user sets +d on root's file" su nobody -s /bin/sh -c 'chattr +d f'
step "another user's 32-bit SETFLAGS" su nobody -s /bin/sh -c "python3 -c '
import fcntl, os, struct, sys
try: fcntl.ioctl(os.open(\"own\", os.O_RDONLY), 0x40046602, struct.pack(\"I\", 0x10))
except OSError as e: sys.exit(e.strerror)'"
flags own
chattr -d own
"#;

fn story(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    // Another user reaches the files.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = script_lines(STEPS, dir);
    // Flags off again, so the directory can be cleaned up.
    run(Command::new("chattr").args(["-i", "-a", "-d", "-A", "f", "d", "own"]).current_dir(dir));
    out
}

#[test]
fn immutable_and_append_only_are_enforced_as_on_ext4() {
    for tool in ["chattr", "lsattr", "python3", "su", "fallocate"] {
        require_tool(tool);
    }
    let ext4 = crate::common::mount::ext4_reference_dir();
    let native = story(ext4.path());
    assert_shows(
        &native,
        &[
            "f flags: i",
            "append to immutable: Operation not permitted",
            "remove immutable: Operation not permitted",
            "read immutable: ok",
            "append to append-only: ok",
            "overwrite append-only: Operation not permitted",
            "create in immutable dir: Operation not permitted",
            "setxattr immutable: Operation not permitted",
            "create in append-only dir: ok",
            "remove from append-only dir: Operation not permitted",
            "touch append-only: ok",
            "touch append-only to a chosen time: Operation not permitted",
            "another user sets +i on its own file: Operation not permitted while setting flags on own",
            "another user's 32-bit SETFLAGS: Inappropriate ioctl for device",
            "another user sets +d on its own file: ok",
        ],
    );
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "chattr", &[]);
    assert_eq!(story(m.dir()), native, "the same steps on ext4 and in the mount");

    // The flags are part of the inode record: they persist, and stay
    // enforced, across a remount; a flag outside the supported set is
    // refused (EOPNOTSUPP, as tmpfs does).
    run(Command::new("chattr").args(["+i", "f"]).current_dir(m.dir()));
    let m = m.remount();
    let lsattr = run(Command::new("lsattr").args(["-d", "f"]).current_dir(m.dir()));
    assert!(lsattr.split_whitespace().next().unwrap().contains('i'), "{lsattr}");
    assert!(std::fs::OpenOptions::new().append(true).open(m.path("f")).is_err());
    run(Command::new("chattr").args(["-i", "f"]).current_dir(m.dir()));
    let out = Command::new("chattr").args(["+c", "f"]).current_dir(m.dir()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Operation not supported"), "{err}");
}
