//! A per-volume quota seen through the mount: df shows it as the size,
//! writes and fallocate past it fail with ENOSPC, a removal gives the
//! room back, and a quota changed while mounted applies at once.

use crate::common::json;
use crate::common::mount::{Mounted, cpath, new_store};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// statfs of `dir`: (size, available) in bytes.
fn df(dir: &Path) -> (u64, u64) {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = cpath(dir);
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize)
}

fn enospc(e: std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

#[test]
fn a_quota_limits_a_mounted_workspace() {
    let (_d, s) = new_store();
    crate::common::ok(&s, &["volume", "create", "ws", "--quota", "8M"]);
    let m = Mounted::new(&s, "ws", &["--checkpoint-every", "0"]);
    assert_eq!(df(m.dir()), (8 * MIB, 8 * MIB));
    std::fs::write(m.path("a"), vec![1u8; 6 << 20]).unwrap();
    assert_eq!(df(m.dir()), (8 * MIB, 2 * MIB));

    // 4 MiB more: the writes that fit land, the first that does not fails.
    let mut b = std::fs::File::create(m.path("b")).unwrap();
    let e = b.write_all(&vec![2u8; 4 << 20]).unwrap_err();
    assert!(enospc(e), "a write past the quota");
    let held = std::fs::metadata(m.path("b")).unwrap().len();
    assert!(held <= 2 * MIB, "b took {held} bytes past the quota");
    // fallocate asks for room the quota does not leave.
    let c = std::fs::File::create(m.path("c")).unwrap();
    let r = unsafe { libc::fallocate(c.as_raw_fd(), 0, 0, 4 << 20) };
    assert_eq!((r, crate::common::mount::errno()), (-1, libc::ENOSPC), "fallocate past the quota");

    // Removing a file gives its room back.
    std::fs::remove_file(m.path("a")).unwrap();
    b.write_all(&vec![2u8; 4 << 20]).unwrap();
    b.sync_all().unwrap();
    let r = json(&s, &["volume", "quota", "ws"]);
    let b_len = std::fs::metadata(m.path("b")).unwrap().len();
    assert_eq!(r["used"].as_u64(), Some(b_len.div_ceil(4096) * 4096), "{r}");

    // A quota changed through the mount's process applies at once.
    let r = json(&s, &["volume", "quota", "ws", "1M"]);
    assert_eq!(r["quota"].as_u64(), Some(MIB), "{r}");
    assert_eq!(df(m.dir()), (MIB, 0));
    let e = std::fs::write(m.path("d"), b"x").unwrap_err();
    assert!(enospc(e), "a write over a lowered quota");
    // Over the quota, shrinking still works.
    std::fs::File::options().write(true).open(m.path("b")).unwrap().set_len(1000).unwrap();
    std::fs::write(m.path("d"), b"x").unwrap();
    crate::common::ok(&s, &["volume", "quota", "ws", "--none"]);
    std::fs::write(m.path("e"), vec![3u8; 2 << 20]).unwrap();
    assert!(df(m.dir()).0 > MIB, "without a quota, df shows the disk");
    drop((b, c));
    m.unmount();
}
