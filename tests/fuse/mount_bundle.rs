//! History bundles while the workspace is mounted: `forkfs bundle` goes
//! through the mount process that holds the store, from files and pipes,
//! and a mounted head that moves shows the imported tree at once.

use crate::common::mount::{Mounted, new_store};
use crate::common::ok;

#[test]
fn bundles_carry_a_mounted_workspace_between_stores() {
    let (a_dir, a) = new_store();
    let (_b_dir, b) = new_store();
    let ma = Mounted::new(&a, "ws", &["--checkpoint-every", "0"]);
    std::fs::write(ma.path("one.txt"), "first!").unwrap();
    ok(&a, &["snapshot", "ws", "--name", "v1"]);
    let full = a_dir.path().join("full.bundle");
    let out = ok(&a, &["bundle", "create", full.to_str().unwrap(), "ws"]);
    assert!(out.contains("bundled 1 versions"), "{out}");
    ok(&b, &["bundle", "import", full.to_str().unwrap()]);
    let mb = Mounted::new(&b, "ws", &["--checkpoint-every", "0"]);
    assert_eq!(std::fs::read_to_string(mb.path("one.txt")).unwrap(), "first!");
    // What the kernel will have cached: the file's pages, and that `dir`
    // does not exist.
    assert!(!mb.path("dir").exists());

    // Both stores held by their mounts: a pipe from one to the other.
    // A new file under the old name: a new inode the kernel does not know.
    std::fs::remove_file(ma.path("one.txt")).unwrap();
    std::fs::write(ma.path("one.txt"), "second").unwrap();
    std::fs::create_dir(ma.path("dir")).unwrap();
    std::fs::write(ma.path("dir/two.txt"), "new").unwrap();
    ok(&a, &["snapshot", "ws", "--name", "v2"]);
    let create = ["bundle", "create", "-", "ws@v1.."];
    let (created, import) = crate::common::piped(&a, &create, &b, &["bundle", "import", "-"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let said = String::from_utf8_lossy(&import.stdout);
    assert!(import.status.success(), "{said} {}", String::from_utf8_lossy(&import.stderr));
    assert!(said.contains("ws now stands at"), "{said}");
    // The kernel shows the new tree, not what it cached of the old one.
    assert_eq!(std::fs::read_to_string(mb.path("one.txt")).unwrap(), "second");
    assert_eq!(std::fs::read_to_string(mb.path("dir/two.txt")).unwrap(), "new");
    let log = crate::common::json(&b, &["log", "ws"]);
    let names: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()))
        .collect();
    assert!(names.contains(&"v1") && names.contains(&"v2"), "{log}");
    mb.unmount();
    ma.unmount();
}
