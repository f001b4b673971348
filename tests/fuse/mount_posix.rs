//! POSIX semantics through the FUSE mount: hard links, RENAME_EXCHANGE,
//! symlinks, attributes (judged against the same calls on ext4), xattrs,
//! statfs, sparse files, shared mmap writes, and readdir of a large
//! directory while it changes. What is stored is checked again after a
//! remount, so it comes from the store and not from the kernel's caches.

use crate::common::mount::{
    Mounted, cpath, getxattr, listxattr, lstat, new_store, removexattr, renameat2, require_tool,
    run, setxattr,
};
use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{FileExt, MetadataExt, symlink};
use std::os::unix::io::AsRawFd;
use std::path::Path;

#[test]
fn hard_links_exchange_and_symlinks() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "links", &[]);
    std::fs::write(m.path("f"), b"first").unwrap();
    std::fs::hard_link(m.path("f"), m.path("g")).unwrap();
    let (f, g) = (lstat(&m.path("f")), lstat(&m.path("g")));
    assert_eq!((f.st_ino, f.st_nlink, g.st_nlink), (g.st_ino, 2, 2));
    std::fs::OpenOptions::new().write(true).open(m.path("g")).unwrap().write_at(b"F", 0).unwrap();
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"First");
    std::fs::remove_file(m.path("f")).unwrap();
    assert_eq!(lstat(&m.path("g")).st_nlink, 1);

    // RENAME_EXCHANGE of two files in different directories, then of a
    // file and a directory.
    for d in ["x", "y"] {
        std::fs::create_dir(m.path(d)).unwrap();
    }
    std::fs::write(m.path("x/a"), crate::common::random(100_000, 1)).unwrap();
    std::fs::write(m.path("y/b"), b"small").unwrap();
    let (ia, ib) = (lstat(&m.path("x/a")).st_ino, lstat(&m.path("y/b")).st_ino);
    renameat2(&m.path("x/a"), &m.path("y/b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!((lstat(&m.path("y/b")).st_ino, lstat(&m.path("x/a")).st_ino), (ia, ib));
    std::fs::create_dir(m.path("y/sub")).unwrap();
    std::fs::write(m.path("y/sub/inside"), b"in").unwrap();
    renameat2(&m.path("y/sub"), &m.path("x/a"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(lstat(&m.path("y/sub")).st_ino, ib, "the inode moves with its name");

    // Symlinks: relative, absolute, dangling, to a directory, longest.
    symlink("g", m.path("rel")).unwrap();
    symlink("/dev/null", m.path("abs")).unwrap();
    symlink("nowhere/at/all", m.path("dangling")).unwrap();
    symlink("x/a", m.path("to-dir")).unwrap();
    let longest = "t/".repeat(2047) + "x";
    symlink(&longest, m.path("longest")).unwrap();

    check_links(&m, &longest, "mounted");
    let m = m.remount();
    check_links(&m, &longest, "after a remount");
}

fn check_links(m: &Mounted, longest: &str, ctx: &str) {
    let (ia, ib) = (lstat(&m.path("y/b")).st_ino, lstat(&m.path("y/sub")).st_ino);
    assert_eq!(std::fs::read(m.path("y/b")).unwrap(), crate::common::random(100_000, 1), "{ctx}");
    assert_eq!(std::fs::read(m.path("y/sub")).unwrap(), b"small", "{ctx}");
    assert_eq!(std::fs::read(m.path("x/a/inside")).unwrap(), b"in", "{ctx}");
    assert_ne!(ia, ib);
    assert_eq!(lstat(&m.path("x/a/..")).st_ino, lstat(&m.path("x")).st_ino, "{ctx}: ..");
    assert_eq!(lstat(&m.path("x")).st_nlink, 3, "{ctx}: x holds one directory");
    assert_eq!(lstat(&m.path("y")).st_nlink, 2, "{ctx}: y holds none");
    assert_eq!(lstat(&m.path("g")).st_nlink, 1, "{ctx}");
    let link = |n: &str| std::fs::read_link(m.path(n)).unwrap();
    assert_eq!(link("rel"), Path::new("g"), "{ctx}");
    assert_eq!(link("abs"), Path::new("/dev/null"), "{ctx}");
    assert_eq!(link("longest"), Path::new(longest), "{ctx}");
    assert_eq!(link("dangling"), Path::new("nowhere/at/all"), "{ctx}");
    assert_eq!(lstat(&m.path("longest")).st_size as usize, longest.len(), "{ctx}");
    assert_eq!(lstat(&m.path("rel")).st_mode & libc::S_IFMT, libc::S_IFLNK, "{ctx}");
    assert_eq!(std::fs::read(m.path("rel")).unwrap(), b"First", "{ctx}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(m.path("abs")).unwrap().file_type().is_char_device(), "{ctx}");
    assert_eq!(std::fs::read(m.path("to-dir/inside")).unwrap(), b"in", "{ctx}");
    assert!(std::fs::metadata(m.path("dangling")).is_err(), "{ctx}");
}

#[test]
fn xattrs_round_trip_and_persist() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "xattrs", &[]);
    std::fs::write(m.path("f"), b"x").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    let values: Vec<(&str, Vec<u8>)> = vec![
        ("user.empty", vec![]),
        ("user.binary", (0..=255).collect()),
        ("user.big", crate::common::random(65_536, 7)),
        ("trusted.root-only", b"t".to_vec()),
    ];
    for p in [m.path("f"), m.path("d")] {
        for (n, v) in &values {
            setxattr(&p, n, v, 0).unwrap();
        }
        setxattr(&p, "user.gone", b"soon", libc::XATTR_CREATE).unwrap();
        setxattr(&p, "user.binary", b"replaced", libc::XATTR_REPLACE).unwrap();
        removexattr(&p, "user.gone").unwrap();
    }
    let m = m.remount();
    for p in [m.path("f"), m.path("d")] {
        let names: BTreeSet<String> = listxattr(&p, 4096).unwrap().into_iter().collect();
        let want: BTreeSet<String> = values.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(names, want, "{}", p.display());
        for (n, v) in &values {
            let v = if *n == "user.binary" { b"replaced".to_vec() } else { v.clone() };
            assert_eq!(getxattr(&p, n, 70_000).unwrap(), v, "{n} of {}", p.display());
        }
    }
}

#[test]
fn statfs_reports_the_store_filesystem() {
    require_tool("df");
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "stat", &[]);
    let out = run(std::process::Command::new("df").arg("-P").arg(m.dir()));
    assert!(out.contains("forkfs:stat"), "df output: {out}");
    let vfs = |p: &Path| {
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(cpath(p).as_ptr(), &mut s) }, 0);
        s
    };
    let (ours, native) = (vfs(m.dir()), vfs(&store));
    assert_eq!(ours.f_namemax, 255);
    let total = |s: &libc::statvfs| s.f_blocks as f64 * s.f_frsize as f64;
    assert!((total(&ours) / total(&native) - 1.0).abs() < 0.01, "sizes differ");
}

#[test]
fn sparse_files_read_zeros_in_holes() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "sparse", &[]);
    let gib = 1u64 << 30;
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(m.path("s"))
        .unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", gib).unwrap();
    assert_eq!(f.metadata().unwrap().len(), gib + 4);
    let read = |f: &std::fs::File, off: u64, len: usize| {
        let mut b = vec![0xAAu8; len];
        f.read_exact_at(&mut b, off).unwrap();
        b
    };
    for off in [4, 65_532, gib / 2 - 3, gib - 100_000] {
        assert!(read(&f, off, 100_000).iter().all(|b| *b == 0), "hole at {off}");
    }
    assert_eq!(read(&f, gib - 2, 6), b"\0\0tail");
    f.set_len(2 * gib).unwrap();
    assert!(read(&f, gib + 4, 1 << 20).iter().all(|b| *b == 0));
    drop(f);
    let m = m.remount();
    let f = std::fs::File::open(m.path("s")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 2 * gib);
    assert_eq!((read(&f, 0, 4), read(&f, gib, 4)), (b"head".to_vec(), b"tail".to_vec()));
}

/// `lseek(fd, off, whence)`: the offset, or the errno.
fn seek(f: &std::fs::File, off: u64, whence: i32) -> Result<u64, i32> {
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    if r < 0 { Err(crate::common::mount::errno()) } else { Ok(r as u64) }
}

/// SEEK_DATA and SEEK_HOLE on a sparse file, live (the overlay), after a
/// remount and in a version under `.forkfs` (the stored map): data where
/// blocks were written, holes (block-granular) elsewhere, the end of the
/// file a hole, ENXIO past it, as ext4 answers for the same file.
#[test]
fn seek_data_and_hole_find_the_written_blocks() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "seek", &["--checkpoint-every", "0"]);
    let gib = 1u64 << 30;
    let f = std::fs::File::create_new(m.path("s")).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", gib).unwrap();
    f.set_len(2 * gib).unwrap();
    let bs = f.metadata().unwrap().blksize();
    assert!(bs >= 4096 && gib % bs == 0, "block size {bs}");
    let (data, hole) = (libc::SEEK_DATA, libc::SEEK_HOLE);
    let expect = [
        (0, data, Ok(0)),
        (2, data, Ok(2)),
        (0, hole, Ok(bs)),
        (bs, data, Ok(gib)),
        (gib / 2, hole, Ok(gib / 2)),
        (gib + 1, data, Ok(gib + 1)),
        (gib, hole, Ok(gib + bs)),
        (gib + bs, data, Err(libc::ENXIO)),
        (gib + bs, hole, Ok(gib + bs)),
        (2 * gib - 1, hole, Ok(2 * gib - 1)),
        (2 * gib, data, Err(libc::ENXIO)),
        (2 * gib, hole, Err(libc::ENXIO)),
    ];
    let check = |f: &std::fs::File, ctx: &str| {
        for (off, whence, want) in expect {
            let name = if whence == data { "SEEK_DATA" } else { "SEEK_HOLE" };
            assert_eq!(seek(f, off, whence), want, "{name} from {off} ({ctx})");
        }
    };
    check(&f, "mounted");
    // A file of inline bytes is all data.
    std::fs::write(m.path("small"), b"abc").unwrap();
    let small = std::fs::File::open(m.path("small")).unwrap();
    assert_eq!((seek(&small, 1, data), seek(&small, 1, hole)), (Ok(1), Ok(3)));
    assert_eq!(seek(&small, 3, data), Err(libc::ENXIO));
    drop((f, small));
    crate::common::ok(&store, &["snapshot", "seek", "--name", "sparse"]);
    let m = m.remount();
    check(&std::fs::File::open(m.path("s")).unwrap(), "after a remount");
    let frozen = m.path(".forkfs/versions/sparse/s");
    check(&std::fs::File::open(frozen).unwrap(), "in a version");
    // The same file on the disk under the test (ext4 or tmpfs) answers alike.
    let native = tempfile::tempdir().unwrap();
    let n = std::fs::File::create_new(native.path().join("s")).unwrap();
    n.write_all_at(b"head", 0).unwrap();
    n.write_all_at(b"tail", gib).unwrap();
    n.set_len(2 * gib).unwrap();
    for (off, whence) in [(bs, data), (gib + bs, data), (2 * gib, hole), (gib / 2, hole)] {
        assert_eq!(
            seek(&n, off, whence),
            expect.iter().find(|e| (e.0, e.1) == (off, whence)).unwrap().2
        );
    }
}

/// st_blocks after each step on a file in `dir`: a dense write, a size
/// grown without data, one byte far out, a hole punched; and the block
/// size it counts in.
fn allocation_steps(dir: &Path) -> (Vec<u64>, u64) {
    let mib = 1u64 << 20;
    let f = std::fs::File::create_new(dir.join("s")).unwrap();
    let allocated = |f: &std::fs::File| {
        f.sync_all().unwrap();
        f.metadata().unwrap().blocks() * 512
    };
    f.write_all_at(&vec![7u8; 4 * mib as usize], 0).unwrap();
    let mut out = vec![allocated(&f)];
    f.set_len(64 * mib).unwrap();
    out.push(allocated(&f));
    f.write_all_at(b"x", 32 * mib).unwrap();
    out.push(allocated(&f));
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, mib as i64, 2 * mib as i64) };
    assert_eq!(r, 0, "punch a hole: errno {}", crate::common::mount::errno());
    out.push(allocated(&f));
    (out, f.metadata().unwrap().blksize())
}

/// What `du`, `cp --sparse` and `tar -S` read: st_blocks counts the blocks
/// that hold data, in the mount as on ext4 (each in its own block size),
/// live, after a remount and in a version.
#[test]
fn st_blocks_count_only_the_blocks_that_hold_data() {
    let mib = 1u64 << 20;
    let want = |bs: u64| vec![4 * mib, 4 * mib, 4 * mib + bs, 2 * mib + bs];
    let native = crate::common::mount::ext4_reference_dir();
    let (got, bs) = allocation_steps(native.path());
    assert_eq!(got, want(bs), "ext4 itself (the reference), block size {bs}");
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "du", &["--checkpoint-every", "0"]);
    let (got, bs) = allocation_steps(m.dir());
    assert!(mib % bs == 0, "block size {bs}");
    assert_eq!(got, want(bs), "in the mount, block size {bs}");
    std::fs::write(m.path("tiny"), b"abc").unwrap();
    crate::common::ok(&store, &["snapshot", "du", "--name", "v"]);
    let m = m.remount();
    for p in ["s", ".forkfs/versions/v/s"] {
        let blocks = std::fs::metadata(m.path(p)).unwrap().blocks() * 512;
        assert_eq!(blocks, 2 * mib + bs, "{p} after a remount");
    }
    assert_eq!(std::fs::metadata(m.path("tiny")).unwrap().blocks(), 1, "a small file");
}

#[test]
fn shared_mmap_writes_reach_the_store() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "mmap", &[]);
    let len = 3 << 20;
    let mut want = crate::common::random(len, 11);
    std::fs::write(m.path("m"), &want).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(m.path("m")).unwrap();
    unsafe {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let s = std::slice::from_raw_parts_mut(p.cast::<u8>(), len);
        assert!(s == &want[..], "mapped bytes differ from the file");
        for (i, off) in [0, 4095, 65_530, 1 << 20, len - 7].into_iter().enumerate() {
            let patch = crate::common::random(7, 100 + i as u64);
            s[off..off + 7].copy_from_slice(&patch);
            want[off..off + 7].copy_from_slice(&patch);
        }
        assert_eq!(libc::munmap(p, len), 0);
    }
    drop(f);
    assert!(std::fs::read(m.path("m")).unwrap() == want, "after munmap and close");
    let m = m.remount();
    assert!(std::fs::read(m.path("m")).unwrap() == want, "after a remount");
}

#[test]
fn large_directory_lists_each_name_once_while_changing() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "bigdir", &[]);
    let dir = m.path("big");
    std::fs::create_dir(&dir).unwrap();
    let n = 5000;
    let name = |i: usize| format!("file-{i:05}-{}", "x".repeat(i % 40));
    for i in 0..n {
        std::fs::write(dir.join(name(i)), b"").unwrap();
    }
    let list = |d: &Path| -> HashMap<String, usize> {
        let mut seen = HashMap::new();
        for e in std::fs::read_dir(d).unwrap() {
            *seen.entry(e.unwrap().file_name().into_string().unwrap()).or_insert(0) += 1;
        }
        seen
    };
    let all: BTreeSet<String> = (0..n).map(name).collect();
    let first = list(&dir);
    assert!(first.values().all(|c| *c == 1), "duplicates in a quiet listing");
    assert_eq!(first.keys().cloned().collect::<BTreeSet<_>>(), all);

    // Odd names are deleted and new names added while listing: every even
    // (untouched) name appears exactly once, nothing appears twice.
    let d2 = dir.clone();
    let churn = std::thread::spawn(move || {
        for i in (1..n).step_by(2) {
            std::fs::remove_file(d2.join(name(i))).unwrap();
            if i % 10 == 1 {
                std::fs::write(d2.join(format!("new-{i}")), b"").unwrap();
            }
        }
    });
    let mut listings = 0;
    while !churn.is_finished() || listings < 3 {
        let seen = list(&dir);
        listings += 1;
        let dups: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
        assert!(dups.is_empty(), "listing {listings} repeats names: {dups:?}");
        for i in (0..n).step_by(2) {
            assert!(seen.contains_key(&name(i)), "listing {listings} misses {}", name(i));
        }
        for k in seen.keys() {
            assert!(all.contains(k) || k.starts_with("new-"), "unknown name {k}");
        }
    }
    churn.join().unwrap();
    let want: BTreeSet<String> = (0..n)
        .filter_map(|i| match i % 2 {
            0 => Some(name(i)),
            _ if i % 10 == 1 => Some(format!("new-{i}")),
            _ => None,
        })
        .collect();
    let last = list(&dir);
    assert!(last.values().all(|c| *c == 1));
    assert_eq!(last.keys().cloned().collect::<BTreeSet<_>>(), want);
    println!("{listings} listings during the churn");
}

#[test]
fn concurrent_writers_to_one_file_keep_every_write() {
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "conc", &["--threads", "4"]);
    let p = m.path("shared");
    std::fs::write(&p, b"").unwrap();
    // Thread t owns records t, t+4, t+8, ...: 3000-byte records sharing
    // 64 KiB blocks with the other threads' records; one more thread reads.
    let (threads, records, len) = (4usize, 200usize, 3000usize);
    let record = move |k: usize| crate::common::random(len, 1000 + k as u64);
    let writers: Vec<_> = (0..threads)
        .map(|t| {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            std::thread::spawn(move || {
                for k in (t..records).step_by(threads).rev() {
                    f.write_all_at(&record(k), (k * len) as u64).unwrap();
                }
            })
        })
        .collect();
    // The size only grows (the kernel may split a write at a page
    // boundary, so it need not be a whole number of records meanwhile).
    let (reader, mut last) = (std::fs::File::open(&p).unwrap(), 0);
    while !writers.iter().all(|w| w.is_finished()) {
        let size = reader.metadata().unwrap().len();
        assert!(size >= last && size <= (records * len) as u64, "size {size} after {last}");
        last = size;
    }
    writers.into_iter().for_each(|w| w.join().unwrap());
    drop(reader);
    let want: Vec<u8> = (0..records).flat_map(record).collect();
    assert!(std::fs::read(&p).unwrap() == want, "records lost or mixed");
    let m = m.remount();
    assert!(std::fs::read(m.path("shared")).unwrap() == want, "after a remount");
}

/// The attributes a sequence of calls leaves: (mode, uid, gid, size,
/// atime, mtime), with times as (secs, nanos).
type Attrs = (u32, u32, u32, i64, (i64, i64), (i64, i64));

fn attrs(p: &Path) -> Attrs {
    let s = lstat(p);
    let (a, m) = ((s.st_atime, s.st_atime_nsec), (s.st_mtime, s.st_mtime_nsec));
    (s.st_mode, s.st_uid, s.st_gid, s.st_size, a, m)
}

fn utimens(p: &Path, a: (i64, i64), m: (i64, i64)) {
    let t = [
        libc::timespec { tv_sec: a.0, tv_nsec: a.1 },
        libc::timespec { tv_sec: m.0, tv_nsec: m.1 },
    ];
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, cpath(p).as_ptr(), t.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat {}: {}", p.display(), std::io::Error::last_os_error());
}

/// Attribute changes applied in `base`; returns the attributes after each.
fn attribute_steps(base: &Path) -> Vec<(String, Attrs)> {
    use std::os::unix::fs::{PermissionsExt, chown};
    let f = base.join("f");
    let mut out = Vec::new();
    let mut step = |what: &str, p: &Path| out.push((what.to_string(), attrs(p)));
    std::fs::write(&f, b"0123456789").unwrap();
    utimens(&f, (1_000_000_000, 5), (1_234_567_890, 999_999_999));
    step("utimens", &f);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4755)).unwrap();
    step("chmod 4755", &f);
    chown(&f, Some(1234), Some(5678)).unwrap();
    step("chown", &f);
    utimens(&f, (-86_400, 500), (0, libc::UTIME_OMIT));
    step("utimens before the epoch, mtime omitted", &f);
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(100_000).unwrap();
    let a = attrs(&f);
    out.push(("truncate up (mtime aside)".into(), (a.0, a.1, a.2, a.3, a.4, (0, 0))));
    utimens(&f, (1, 0), (2, 0));
    let d = base.join("sgid");
    std::fs::create_dir(&d).unwrap();
    chown(&d, None, Some(777)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::write(d.join("file"), b"").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    let strip = |p: &Path| {
        let a = attrs(p);
        (a.0, a.1, a.2, 0, (0, 0), (0, 0))
    };
    out.push(("file in a set-group-ID dir".into(), strip(&d.join("file"))));
    out.push(("dir in a set-group-ID dir".into(), strip(&d.join("sub"))));
    out.push(("final".into(), attrs(&f)));
    out
}

#[test]
fn attributes_match_ext4_and_persist() {
    let native = crate::common::mount::ext4_reference_dir();
    let want = attribute_steps(native.path());
    let (_d, store) = new_store();
    let m = Mounted::new(&store, "attrs", &[]);
    std::fs::create_dir(m.path("w")).unwrap();
    assert_eq!(attribute_steps(&m.path("w")), want);

    // ctime moves on chmod (and mtime does not).
    let f = m.path("w/f");
    let before = lstat(&f);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let after = lstat(&f);
    assert!((after.st_ctime, after.st_ctime_nsec) > (before.st_ctime, before.st_ctime_nsec));
    assert_eq!((after.st_mtime, after.st_mtime_nsec), (before.st_mtime, before.st_mtime_nsec));
    let now = attrs(&f);
    let m = m.remount();
    assert_eq!(attrs(&m.path("w/f")), now, "after a remount");
    assert_eq!(lstat(&m.path("w/f")).st_ctime, after.st_ctime);
}
