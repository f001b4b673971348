//! POSIX ACLs in the mount, judged against ext4 in the same test: access
//! ACLs are enforced, chmod rewrites the mask, an ACL the mode says in
//! full is not kept, and new inodes take a directory's default ACL
//! instead of the umask.

use crate::common::mount::{
    Mounted, assert_shows, getxattr, new_store, require_tool, run, script_lines,
};
use std::path::Path;
use std::process::Command;

/// What a user sees through the same steps in `dir`: one line per step.
const STEPS: &str = r#"
step() { label=$1; shift; if "$@" >/dev/null 2>&1; then echo "$label: ok"; else echo "$label: denied"; fi; }
as_nobody() { su nobody -s /bin/sh -c "$1"; }
umask 022
echo secret > f; chmod 600 f
mkdir d; chmod 700 d; echo inside > d/g; chmod 644 d/g
step "nobody reads f" as_nobody 'cat f'
setfacl -m u:nobody:r f
step "nobody reads f with an ACL entry" as_nobody 'cat f'
stat -c 'f mode %a' f
getfacl --omit-header f
step "nobody reads d/g" as_nobody 'cat d/g'
setfacl -m u:nobody:x d
step "nobody reads d/g through d's ACL" as_nobody 'cat d/g'
chmod 614 f
getfacl --omit-header f
step "nobody reads f, its entry masked by chmod" as_nobody 'cat f'
setfacl -b f
stat -c 'f mode after setfacl -b %a' f
echo plain > p; setfacl -m u::rw,g::r,o::- p
stat -c 'p mode %a' p
mkdir inh; setfacl -d -m u:nobody:rwx,g::r-x,o::--- inh; chmod 777 inh
(umask 077; echo new > inh/new; mkdir inh/sub; mkfifo inh/fifo; ln -s new inh/link)
stat -c '%n %a' inh/new inh/sub inh/fifo
getfacl --omit-header inh/new inh/sub
step "nobody writes inh/new" as_nobody 'echo more >> inh/new'
(umask 027; touch plain; mkdir plaind)
stat -c '%n %a' plain plaind
"#;

fn story(dir: &Path) -> Vec<String> {
    script_lines(STEPS, dir)
}

#[test]
fn acls_are_enforced_and_inherited_as_on_ext4() {
    use std::os::unix::fs::PermissionsExt;
    for tool in ["su", "setfacl", "getfacl"] {
        require_tool(tool);
    }
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "acl", &[]);
    let ext4 = crate::common::mount::ext4_reference_dir();
    for d in [ext4.path(), m.dir()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let native = story(ext4.path());
    // The reference behaves as the steps expect (so a matching mount
    // does too): access granted by an entry, taken away by the mask.
    assert_shows(
        &native,
        &[
            "nobody reads f: denied",
            "nobody reads f with an ACL entry: ok",
            "nobody reads d/g through d's ACL: ok",
            "nobody reads f, its entry masked by chmod: denied",
            "nobody writes inh/new: ok",
            "inh/new 660",
            "plain 640",
        ],
    );
    assert_eq!(story(m.dir()), native, "the same steps on ext4 and in the mount");

    // An ACL the mode says in full is not kept, as on ext4.
    let p = m.dir().join("p");
    assert_eq!(getxattr(&p, "system.posix_acl_access", 256), Err(libc::ENODATA));

    // ACLs are part of the version: they survive a remount.
    let getfacl = |dir: &Path| {
        run(Command::new("getfacl")
            .args(["--omit-header", "f", "d", "inh", "inh/sub"])
            .current_dir(dir))
    };
    let before = getfacl(m.dir());
    assert_eq!(before, getfacl(ext4.path()));
    let m = m.remount();
    assert_eq!(getfacl(m.dir()), before, "after a remount");
}
