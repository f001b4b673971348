//! POSIX error conditions through the FUSE mount, judged against ext4:
//! every case runs the same syscalls in a fresh directory on the native
//! filesystem (a tempdir under /tmp) and in a fresh directory inside the
//! mount, and the outcomes (errno, or the value a succeeding case returns)
//! must be equal. The errno named beside each case documents the intent and
//! is checked against ext4 only, so a broken case cannot pass vacuously.

use crate::common::mount::{
    Mounted, check, cpath, errno, getxattr, listxattr, new_store, removexattr, renameat2, setxattr,
};
use libc::c_int;
use std::path::{Path, PathBuf};

type Outcome = Result<i64, i32>;

fn file(d: &Path, name: &str) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, b"some data").unwrap();
    p
}

fn dir(d: &Path, name: &str) -> PathBuf {
    let p = d.join(name);
    std::fs::create_dir(&p).unwrap();
    p
}

fn long(n: usize) -> String {
    "n".repeat(n)
}

/// open(2) and close: Ok(0) or the errno.
fn open(p: &Path, flags: c_int) -> Outcome {
    let fd = unsafe { libc::open(cpath(p).as_ptr(), flags, 0o644) };
    if fd < 0 {
        return Err(errno());
    }
    unsafe { libc::close(fd) };
    Ok(0)
}

fn fd_of(p: &Path, flags: c_int) -> c_int {
    let fd = unsafe { libc::open(cpath(p).as_ptr(), flags, 0o644) };
    assert!(fd >= 0, "open {}: {}", p.display(), std::io::Error::last_os_error());
    fd
}

fn fstat(fd: c_int) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    st
}

fn rename(a: &Path, b: &Path) -> Outcome {
    check(unsafe { libc::rename(cpath(a).as_ptr(), cpath(b).as_ptr()) } as i64)
}

fn link(a: &Path, b: &Path) -> Outcome {
    check(unsafe { libc::link(cpath(a).as_ptr(), cpath(b).as_ptr()) } as i64)
}

fn mkdir(p: &Path) -> Outcome {
    check(unsafe { libc::mkdir(cpath(p).as_ptr(), 0o755) } as i64)
}

fn rmdir(p: &Path) -> Outcome {
    check(unsafe { libc::rmdir(cpath(p).as_ptr()) } as i64)
}

fn unlink(p: &Path) -> Outcome {
    check(unsafe { libc::unlink(cpath(p).as_ptr()) } as i64)
}

fn symlink(target: &str, p: &Path) -> Outcome {
    check(unsafe { libc::symlink(cpath(Path::new(target)).as_ptr(), cpath(p).as_ptr()) } as i64)
}

fn nlink(p: &Path) -> Outcome {
    Ok(crate::common::mount::lstat(p).st_nlink as i64)
}

fn entries(d: &Path) -> Outcome {
    Ok(std::fs::read_dir(d).unwrap().count() as i64)
}

/// An xattr outcome: Ok(value length) or the errno.
fn xlen(r: Result<Vec<u8>, i32>) -> Outcome {
    r.map(|v| v.len() as i64)
}

/// (what, intended errno or 0 for success, the case).
type Case = (&'static str, i32, fn(&Path) -> Outcome);

const RO: c_int = libc::O_RDONLY;
const CREAT: c_int = libc::O_CREAT | libc::O_WRONLY;

fn cases() -> Vec<Case> {
    use libc::{
        AT_FDCWD, E2BIG, EBADF, EEXIST, EFBIG, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENODATA,
        ENOENT, ENOTDIR, ENOTEMPTY, EOPNOTSUPP, EPERM, ERANGE, FALLOC_FL_PUNCH_HOLE, O_DIRECTORY,
        O_EXCL, O_NOFOLLOW, O_RDWR, O_WRONLY, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT,
        S_IFIFO, XATTR_CREATE, XATTR_REPLACE,
    };
    vec![
        ("open missing file", ENOENT, |d| open(&d.join("missing"), RO)),
        ("create under missing dir", ENOENT, |d| open(&d.join("nodir/x"), CREAT)),
        ("unlink missing", ENOENT, |d| unlink(&d.join("missing"))),
        ("rmdir missing", ENOENT, |d| rmdir(&d.join("missing"))),
        ("rename missing source", ENOENT, |d| rename(&d.join("missing"), &d.join("b"))),
        ("link from missing", ENOENT, |d| link(&d.join("missing"), &d.join("b"))),
        ("mkdir existing dir", EEXIST, |d| mkdir(&dir(d, "a"))),
        ("mkdir over file", EEXIST, |d| mkdir(&file(d, "a"))),
        ("link onto existing", EEXIST, |d| link(&file(d, "a"), &file(d, "b"))),
        ("symlink onto existing", EEXIST, |d| symlink("x", &file(d, "a"))),
        ("mkfifo onto existing", EEXIST, |d| {
            check(unsafe { libc::mknod(cpath(&file(d, "a")).as_ptr(), S_IFIFO | 0o644, 0) } as i64)
        }),
        ("O_CREAT|O_EXCL existing", EEXIST, |d| open(&file(d, "a"), CREAT | O_EXCL)),
        ("O_CREAT|O_EXCL dangling symlink", EEXIST, |d| {
            symlink("nowhere", &d.join("l")).unwrap();
            open(&d.join("l"), CREAT | O_EXCL)
        }),
        ("rmdir non-empty", ENOTEMPTY, |d| {
            file(&dir(d, "a"), "f");
            rmdir(&d.join("a"))
        }),
        ("rename dir onto non-empty dir", ENOTEMPTY, |d| {
            file(&dir(d, "b"), "f");
            rename(&dir(d, "a"), &d.join("b"))
        }),
        ("rename dir onto its parent", ENOTEMPTY, |d| {
            rename(&dir(&dir(d, "a"), "b"), &d.join("a"))
        }),
        ("rmdir ..", ENOTEMPTY, |d| rmdir(&dir(d, "a").join(".."))),
        ("unlink dir", EISDIR, |d| unlink(&dir(d, "a"))),
        ("open dir O_WRONLY", EISDIR, |d| open(&dir(d, "a"), O_WRONLY)),
        ("open dir O_RDWR", EISDIR, |d| open(&dir(d, "a"), O_RDWR)),
        ("truncate dir", EISDIR, |d| {
            check(unsafe { libc::truncate(cpath(&dir(d, "a")).as_ptr(), 0) } as i64)
        }),
        ("rename file onto dir", EISDIR, |d| rename(&file(d, "a"), &dir(d, "b"))),
        ("rmdir file", ENOTDIR, |d| rmdir(&file(d, "a"))),
        ("open through a file", ENOTDIR, |d| open(&file(d, "a").join("x"), RO)),
        ("mkdir through a file", ENOTDIR, |d| mkdir(&file(d, "a").join("x"))),
        ("rename dir onto file", ENOTDIR, |d| rename(&dir(d, "a"), &file(d, "b"))),
        ("O_DIRECTORY on file", ENOTDIR, |d| open(&file(d, "a"), RO | O_DIRECTORY)),
        ("unlink file/", ENOTDIR, |d| unlink(&file(d, "a").join(""))),
        ("create 256-byte name", ENAMETOOLONG, |d| open(&d.join(long(256)), CREAT)),
        ("mkdir 256-byte name", ENAMETOOLONG, |d| mkdir(&d.join(long(256)))),
        ("stat 256-byte name", ENAMETOOLONG, |d| open(&d.join(long(256)), RO)),
        ("rename to 256-byte name", ENAMETOOLONG, |d| rename(&file(d, "a"), &d.join(long(256)))),
        ("link to 256-byte name", ENAMETOOLONG, |d| link(&file(d, "a"), &d.join(long(256)))),
        ("symlink named 256 bytes", ENAMETOOLONG, |d| symlink("x", &d.join(long(256)))),
        ("create 255-byte name", 0, |d| open(&d.join(long(255)), CREAT)),
        ("rename dir into own subdir", EINVAL, |d| {
            rename(&dir(d, "a"), &dir(&d.join("a"), "b").join("c"))
        }),
        ("rename dir onto itself below", EINVAL, |d| rename(&dir(d, "a"), &d.join("a/a"))),
        ("rmdir .", EINVAL, |d| rmdir(&dir(d, "a").join("."))),
        ("link to a directory", EPERM, |d| link(&dir(d, "a"), &d.join("b"))),
        ("link an unlinked open file", ENOENT, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            unlink(&d.join("a")).unwrap();
            let proc = cpath(Path::new(&format!("/proc/self/fd/{fd}")));
            let r = unsafe {
                libc::linkat(AT_FDCWD, proc.as_ptr(), AT_FDCWD, cpath(&d.join("b")).as_ptr(), 0x400)
            };
            let r = check(r as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("getxattr missing", ENODATA, |d| xlen(getxattr(&file(d, "a"), "user.x", 64))),
        ("removexattr missing", ENODATA, |d| removexattr(&file(d, "a"), "user.x")),
        ("setxattr CREATE existing", EEXIST, |d| {
            let f = file(d, "a");
            setxattr(&f, "user.x", b"1", 0).unwrap();
            setxattr(&f, "user.x", b"2", XATTR_CREATE)
        }),
        ("setxattr REPLACE missing", ENODATA, |d| {
            setxattr(&file(d, "a"), "user.x", b"1", XATTR_REPLACE)
        }),
        ("getxattr small buffer", ERANGE, |d| {
            let f = file(d, "a");
            setxattr(&f, "user.x", b"0123456789", 0).unwrap();
            xlen(getxattr(&f, "user.x", 4))
        }),
        ("getxattr size query", 0, |d| {
            let f = file(d, "a");
            setxattr(&f, "user.x", b"0123456789", 0).unwrap();
            getxattr(&f, "user.x", 0).map(|v| i64::from_le_bytes(v.try_into().unwrap()))
        }),
        ("listxattr small buffer", ERANGE, |d| {
            let f = file(d, "a");
            setxattr(&f, "user.first", b"1", 0).unwrap();
            setxattr(&f, "user.second", b"2", 0).unwrap();
            listxattr(&f, 8).map(|n| n.len() as i64)
        }),
        ("setxattr value over 64 KiB", E2BIG, |d| {
            setxattr(&file(d, "a"), "user.x", &vec![7u8; 65_537], 0)
        }),
        ("getxattr 256-byte name", ERANGE, |d| {
            xlen(getxattr(&file(d, "a"), &format!("user.{}", long(251)), 64))
        }),
        ("user xattr on a symlink", EPERM, |d| {
            symlink("x", &d.join("l")).unwrap();
            let n = std::ffi::CString::new("user.x").unwrap();
            let r = unsafe {
                libc::lsetxattr(
                    cpath(&d.join("l")).as_ptr(),
                    n.as_ptr(),
                    b"v".as_ptr().cast(),
                    1,
                    0,
                )
            };
            check(r as i64)
        }),
        ("xattr on an unlinked open file", 0, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            unlink(&d.join("a")).unwrap();
            let n = std::ffi::CString::new("user.x").unwrap();
            let r = unsafe { libc::fsetxattr(fd, n.as_ptr(), b"abc".as_ptr().cast(), 3, 0) };
            let r = check(r as i64).and_then(|_| {
                let mut b = [0u8; 16];
                check(unsafe { libc::fgetxattr(fd, n.as_ptr(), b.as_mut_ptr().cast(), 16) } as i64)
            });
            unsafe { libc::close(fd) };
            r
        }),
        ("renameat2 NOREPLACE onto existing", EEXIST, |d| {
            renameat2(&file(d, "a"), &file(d, "b"), RENAME_NOREPLACE)
        }),
        ("renameat2 EXCHANGE missing target", ENOENT, |d| {
            renameat2(&file(d, "a"), &d.join("b"), RENAME_EXCHANGE)
        }),
        ("renameat2 EXCHANGE|NOREPLACE", EINVAL, |d| {
            renameat2(&file(d, "a"), &file(d, "b"), RENAME_EXCHANGE | RENAME_NOREPLACE)
        }),
        ("renameat2 EXCHANGE dir into own subdir", EINVAL, |d| {
            let sub = dir(&dir(d, "a"), "b");
            renameat2(&d.join("a"), &sub, RENAME_EXCHANGE)
        }),
        ("open symlink O_NOFOLLOW", ELOOP, |d| {
            file(d, "a");
            symlink("a", &d.join("l")).unwrap();
            open(&d.join("l"), RO | O_NOFOLLOW)
        }),
        ("symlink loop", ELOOP, |d| {
            symlink("l2", &d.join("l1")).unwrap();
            symlink("l1", &d.join("l2")).unwrap();
            open(&d.join("l1"), RO)
        }),
        ("readlink a regular file", EINVAL, |d| {
            let mut b = [0u8; 64];
            check(unsafe {
                libc::readlink(cpath(&file(d, "a")).as_ptr(), b.as_mut_ptr().cast(), 64)
            } as i64)
        }),
        ("ftruncate read-only fd", EINVAL, |d| {
            let fd = fd_of(&file(d, "a"), RO);
            let r = check(unsafe { libc::ftruncate(fd, 0) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("write read-only fd", EBADF, |d| {
            let fd = fd_of(&file(d, "a"), RO);
            let r = check(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("pwrite beyond the largest file", EFBIG, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            let r = check(unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 1 << 61) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("ftruncate beyond the largest file", EFBIG, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            let r = check(unsafe { libc::ftruncate(fd, 1 << 61) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("punch hole without KEEP_SIZE", EOPNOTSUPP, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            let r = check(unsafe { libc::fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 4) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        ("mkdir in a removed directory", ENOENT, |d| {
            let fd = fd_of(&dir(d, "a"), RO | O_DIRECTORY);
            rmdir(&d.join("a")).unwrap();
            let r = check(unsafe { libc::mkdirat(fd, c"x".as_ptr(), 0o755) } as i64);
            unsafe { libc::close(fd) };
            r
        }),
        // Successes whose returned state must match too.
        ("rename onto a hard link of itself", 0, |d| {
            link(&file(d, "a"), &d.join("b")).unwrap();
            rename(&d.join("a"), &d.join("b")).unwrap();
            entries(d)
        }),
        ("rename dir over empty dir: parent nlink", 0, |d| {
            let a = dir(d, "a");
            dir(&a, "b");
            dir(&a, "c");
            rename(&a.join("b"), &a.join("c")).unwrap();
            nlink(&a)
        }),
        ("exchange dir and file across dirs: nlinks", 0, |d| {
            let (x, y) = (dir(d, "x"), dir(d, "y"));
            dir(&x, "sub");
            file(&y, "f");
            renameat2(&x.join("sub"), &y.join("f"), RENAME_EXCHANGE).unwrap();
            Ok(nlink(&x)? * 100 + nlink(&y)?)
        }),
        // RENAME_WHITEOUT (an overlayfs upper directory): a 0:0 character
        // device stays at the old name.
        ("rename with RENAME_WHITEOUT: what stays", 0, |d| {
            renameat2(&file(d, "a"), &d.join("b"), RENAME_WHITEOUT).unwrap();
            let st = crate::common::mount::lstat(&d.join("a"));
            let chr = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
            let moved = std::fs::read(d.join("b")).unwrap() == b"some data";
            Ok(i64::from(chr) * 100 + i64::from(st.st_rdev == 0) * 10 + i64::from(moved))
        }),
        ("RENAME_WHITEOUT over a file: entries", 0, |d| {
            renameat2(&file(d, "a"), &file(d, "b"), RENAME_WHITEOUT).unwrap();
            entries(d)
        }),
        ("RENAME_WHITEOUT | NOREPLACE onto a name", EEXIST, |d| {
            renameat2(&file(d, "a"), &file(d, "b"), RENAME_WHITEOUT | RENAME_NOREPLACE)
        }),
        ("RENAME_WHITEOUT | EXCHANGE", EINVAL, |d| {
            renameat2(&file(d, "a"), &file(d, "b"), RENAME_WHITEOUT | RENAME_EXCHANGE)
        }),
        ("RENAME_WHITEOUT of a directory: kind left", 0, |d| {
            renameat2(&dir(d, "a"), &d.join("b"), RENAME_WHITEOUT).unwrap();
            Ok(i64::from(crate::common::mount::lstat(&d.join("a")).st_mode & libc::S_IFMT))
        }),
        ("fstat of an unlinked open file: nlink", 0, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            unlink(&d.join("a")).unwrap();
            let n = fstat(fd).st_nlink as i64;
            unsafe { libc::close(fd) };
            Ok(n)
        }),
        // An open directory outlives its name, as an open file does.
        ("fstat of a removed open directory: nlink", 0, |d| {
            let fd = fd_of(&dir(d, "a"), RO | O_DIRECTORY);
            rmdir(&d.join("a")).unwrap();
            let st = fstat(fd);
            unsafe { libc::close(fd) };
            Ok(st.st_nlink as i64 * 10 + i64::from(st.st_mode & libc::S_IFMT == libc::S_IFDIR))
        }),
        ("fchmod a removed open directory: mode", 0, |d| {
            let fd = fd_of(&dir(d, "a"), RO | O_DIRECTORY);
            rmdir(&d.join("a")).unwrap();
            check(unsafe { libc::fchmod(fd, 0o700) } as i64).unwrap();
            let mode = fstat(fd).st_mode & 0o7777;
            unsafe { libc::close(fd) };
            Ok(mode as i64)
        }),
        ("fstat of an open directory renamed over: nlink", 0, |d| {
            let fd = fd_of(&dir(d, "a"), RO | O_DIRECTORY);
            dir(d, "b");
            rename(&d.join("b"), &d.join("a")).unwrap();
            let n = fstat(fd).st_nlink as i64;
            unsafe { libc::close(fd) };
            Ok(n)
        }),
        ("ftruncate an unlinked open file: size", 0, |d| {
            let fd = fd_of(&file(d, "a"), O_RDWR);
            unlink(&d.join("a")).unwrap();
            check(unsafe { libc::ftruncate(fd, 100_000) } as i64).unwrap();
            let n = fstat(fd).st_size;
            unsafe { libc::close(fd) };
            Ok(n)
        }),
    ]
}

fn name(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

fn show(o: &Outcome) -> String {
    match o {
        Ok(v) => format!("ok {v}"),
        Err(e) => name(*e),
    }
}

/// Runs every case in its own fresh directory under `base`.
fn run_all(base: &Path) -> Vec<Outcome> {
    cases()
        .iter()
        .enumerate()
        .map(|(i, (_, _, case))| {
            let d = base.join(format!("case{i:02}"));
            std::fs::create_dir(&d).unwrap();
            case(&d)
        })
        .collect()
}

#[test]
fn errnos_match_ext4_case_by_case() {
    let native = crate::common::mount::ext4_reference_dir();
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "errno", &[]);
    let fuse_base = m.path("cases");
    std::fs::create_dir(&fuse_base).unwrap();

    let reference = run_all(native.path());
    let ours = run_all(&fuse_base);

    let mut table = Vec::new();
    for (((what, intended, _), ext4), fuse) in cases().iter().zip(&reference).zip(&ours) {
        let meant = if *intended == 0 { ext4.is_ok() } else { *ext4 == Err(*intended) };
        assert!(meant, "case {what:?} is broken: ext4 gives {} (meant {})", show(ext4), {
            if *intended == 0 { "success".into() } else { name(*intended) }
        });
        if ext4 != fuse {
            table.push(format!("{what:<45} ext4: {:<40} forkfs: {}", show(ext4), show(fuse)));
        }
    }
    println!("{} cases compared", reference.len());
    assert!(table.is_empty(), "{} of {} cases differ:\n{}", table.len(), ours.len(), {
        table.join("\n")
    });
}
