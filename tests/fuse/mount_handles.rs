//! File handles (`name_to_handle_at` / `open_by_handle_at`, what an NFS
//! server keeps) in the mount, beside ext4 in the same test: a handle
//! opens its file and its directory after the kernel's caches are
//! dropped, and a removed file's handle is stale.

use crate::common::mount::{Mounted, cpath, errno, new_store};
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// A file handle as the kernel encodes it (the header, then its bytes).
struct Handle(Vec<u64>);

fn handle_of(p: &Path) -> Result<Handle, i32> {
    let mut buf = vec![0u64; 16];
    let h = buf.as_mut_ptr() as *mut libc::file_handle;
    unsafe { (*h).handle_bytes = (buf.len() * 8 - 8) as u32 };
    let mut mount_id = 0;
    let r =
        unsafe { libc::name_to_handle_at(libc::AT_FDCWD, cpath(p).as_ptr(), h, &mut mount_id, 0) };
    if r < 0 { Err(errno()) } else { Ok(Handle(buf)) }
}

fn open_by(mount: &Path, h: &mut Handle, flags: i32) -> Result<std::fs::File, i32> {
    let m = std::fs::File::open(mount).expect("open the mount's root");
    use std::os::fd::AsRawFd;
    let fd = unsafe {
        libc::open_by_handle_at(m.as_raw_fd(), h.0.as_mut_ptr() as *mut libc::file_handle, flags)
    };
    if fd < 0 {
        return Err(errno());
    }
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop dentries and inodes (root)");
}

/// What the steps show in `root`: the file's bytes through its handle, a
/// name read through the directory's handle, the removed file's errno.
fn story(root: &Path) -> (Vec<u8>, Vec<u8>, i32) {
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::write(root.join("a/b/f"), b"through a handle").unwrap();
    std::fs::write(root.join("a/b/gone"), b"soon removed").unwrap();
    let mut file = handle_of(&root.join("a/b/f")).expect("a handle for a file");
    let mut dir = handle_of(&root.join("a/b")).expect("a handle for a directory");
    let mut gone = handle_of(&root.join("a/b/gone")).expect("a handle for a file");
    std::fs::remove_file(root.join("a/b/gone")).unwrap();
    drop_caches();
    let mut bytes = Vec::new();
    open_by(root, &mut file, libc::O_RDONLY)
        .expect("open by handle")
        .read_to_end(&mut bytes)
        .unwrap();
    drop_caches();
    let d = open_by(root, &mut dir, libc::O_RDONLY | libc::O_DIRECTORY)
        .expect("open a directory by handle");
    use std::os::fd::AsRawFd;
    let fd = unsafe { libc::openat(d.as_raw_fd(), c"f".as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0, "openat through the directory's handle: errno {}", errno());
    let mut through_dir = Vec::new();
    std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }).read_to_end(&mut through_dir).unwrap();
    let stale = open_by(root, &mut gone, libc::O_RDONLY).map(|_| ()).expect_err("a removed file");
    (bytes, through_dir, stale)
}

#[test]
fn file_handles_outlive_the_kernels_caches_as_on_ext4() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "handles", &[]);
    let ext4 = crate::common::mount::ext4_reference_dir();
    let native = story(ext4.path());
    let want = (b"through a handle".to_vec(), b"through a handle".to_vec(), libc::ESTALE);
    assert_eq!(native, want, "ext4 itself (the reference)");
    assert_eq!(story(m.dir()), native, "the same steps in the mount");
}
