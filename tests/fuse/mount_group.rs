//! Volume groups through the process that holds the store: group
//! snapshots of two mounted workspaces (and an unserved disk) taken while
//! a writer updates both are consistent cuts, and restore and fork act on
//! every member.

use crate::common::mount::{Mounted, new_store};
use crate::common::{json, ok};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The counter a file holds (0 when empty).
fn counter(p: &std::path::Path) -> u64 {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    s.trim().parse().unwrap_or(0)
}

#[test]
fn group_snapshots_cut_every_member_at_one_moment() {
    let (_d, s) = new_store();
    let a = Mounted::new(&s, "a", &["--checkpoint-every", "0"]);
    let b = Mounted::new(&s, "b", &["--checkpoint-every", "0"]);
    ok(&s, &["volume", "create", "disk", "--block", "--size", "1M"]);
    ok(&s, &["group", "create", "env", "a", "b", "disk"]);
    // The writer: n into a's counter, then n into b's, each write one
    // request; at any cut, a holds n and b holds n or n - 1.
    let fa = std::fs::File::create(a.path("counter")).unwrap();
    let fb = std::fs::File::create(b.path("counter")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                fa.write_all_at(format!("{n:020}").as_bytes(), 0).unwrap();
                fb.write_all_at(format!("{n:020}").as_bytes(), 0).unwrap();
            }
            n
        })
    };
    for i in 0..12 {
        std::thread::sleep(std::time::Duration::from_millis(30));
        ok(&s, &["snapshot", "--group", "env", "--name", &format!("g{i}")]);
    }
    stop.store(true, Ordering::Relaxed);
    let last = writer.join().unwrap();
    let log = json(&s, &["log", "--group", "env"]);
    let versions = log.as_array().unwrap();
    assert_eq!(versions.len(), 12, "{log}");
    let mut seen = Vec::new();
    for v in versions {
        let m = v["members"].as_array().unwrap();
        assert_eq!(m.len(), 3, "{v}");
        let short = |vol: &str| {
            let id = m.iter().find(|x| x["volume"] == vol).unwrap()["version"].as_str().unwrap();
            id[..12].to_string()
        };
        let x = counter(&a.path(&format!(".forkfs/versions/{}/counter", short("a"))));
        let y = counter(&b.path(&format!(".forkfs/versions/{}/counter", short("b"))));
        assert!(x == y || x == y + 1, "{} cut a at {x} and b at {y}", v["name"]);
        seen.push(x);
    }
    // Newest first: the writer went on between the first cut and the last.
    assert!(seen[seen.len() - 1] < seen[0], "the writer ran during the snapshots: {seen:?}");
    assert!(seen[0] <= last);

    // Restore every member to a group version, then fork one.
    let mid = &versions[6];
    let name = mid["name"].as_str().unwrap();
    ok(&s, &["restore", "--group", "env", name]);
    let (x, y) = (counter(&a.path("counter")), counter(&b.path("counter")));
    assert!(x == y || x == y + 1, "restored to a at {x} and b at {y}");
    assert!(x < seen[0], "the restore took a back from {} to {x}", seen[0]);
    let after = json(&s, &["log", "--group", "env"]);
    assert_eq!(after.as_array().unwrap().len(), 13, "the restore is itself a group version");
    assert_eq!(after[0]["origin"], "restore", "{after}");
    ok(&s, &["fork", "--group", &format!("env@{name}"), "env2"]);
    let groups = json(&s, &["group", "list"]);
    let env2 = groups.as_array().unwrap().iter().find(|g| g["name"] == "env2").unwrap();
    assert_eq!(env2["members"], serde_json::json!(["env2.a", "env2.b", "env2.disk"]), "{groups}");
    // Member versions are kept while a group version names them.
    let member = mid["members"][0]["volume"].as_str().unwrap().to_string();
    let id = mid["members"][0]["version"].as_str().unwrap();
    let (code, msg) = crate::common::fails(&s, &["delete-version", &format!("{member}@{id}")]);
    assert_eq!(code, 75, "{msg}");
    b.unmount();
    a.unmount();
}
