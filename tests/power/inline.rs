//! A small file keeps its bytes in its inode record; the write that grows
//! it past that moves them into blocks, which live in the data log until
//! the next checkpoint. The record that drops them may become durable
//! before the log does: any synced RocksDB write (a `volume create`
//! through the control socket, say) syncs the WAL it is in, and RocksDB
//! flushes memtables on its own. A power cut then kept the blocks' entries
//! and lost their data, and the bytes an fsync had acknowledged read as
//! zeros: nothing durable was under those entries.
//!
//! A file made since the last promise of durability (an fsync of the
//! volume, a checkpoint) had nothing promised: it moves its bytes without
//! that sync, and a power cut may take them, but leaves every byte as
//! written or zero.
//!
//! Negative controls (by hand): without any one of the three
//! `Txn::moved_inline` calls (`head/fs/ops.rs` write and resize,
//! `head/fs/copy.rs`), its round reads the fsynced bytes as zeros; so
//! does the write round without the mark an fsync moves (`FsHead::flush`),
//! and the checkpoint round without the one a checkpoint moves
//! (`Head::publish`). Each round has a store of its own: one sync of the
//! log covers every append before it, so a round's fix would hide
//! another's missing one.

use crate::Machine;
use crate::common::mount::{lazy_unmount, mount_pid, wait_gone};
use crate::common::random;
use std::io::Write;

/// Each way a file leaves its inline bytes: a write past them, a
/// truncation that grows it, a copy of blocks into it.
#[derive(Clone, Copy, Debug)]
enum Grow {
    Write,
    Truncate,
    Copy,
}

/// What made the small file's bytes durable before it grew.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Promise {
    Fsync,
    /// A version of the volume (`forkfs snapshot`), no fsync.
    Checkpoint,
    /// Nothing: the bytes may be lost with the growth.
    None,
}

#[test]
fn fsynced_inline_bytes_survive_a_power_cut_after_the_file_outgrows_them() {
    for how in [Grow::Write, Grow::Truncate, Grow::Copy] {
        if let Err(e) = outgrow(how, Promise::Fsync) {
            panic!("{how:?}: {e}");
        }
    }
}

#[test]
fn inline_bytes_of_a_version_survive_and_unpromised_ones_read_as_written_or_zero() {
    for promise in [Promise::Checkpoint, Promise::None] {
        if let Err(e) = outgrow(Grow::Write, promise) {
            panic!("{promise:?}: {e}");
        }
    }
}

/// One round on a store of its own: a small file made durable as
/// `promise` says, grown without an fsync, a synced RocksDB write,
/// SIGKILL, the power cut.
fn outgrow(how: Grow, promise: Promise) -> Result<(), String> {
    let mut m = Machine::new();
    m.ok(&["init"]);
    m.ok(&["volume", "create", "ws"]);
    let dir = tempfile::tempdir().unwrap();
    let out =
        m.ok(&["mount", "ws", dir.path().to_str().unwrap(), "--daemon", "--checkpoint-every", "0"]);
    let pid = mount_pid(&out);
    let (path, big) = (dir.path().join("f"), dir.path().join("big"));
    let small = random(1000, 1);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&small).unwrap();
    match promise {
        Promise::Fsync => f.sync_all().unwrap(),
        Promise::Checkpoint => {
            m.ok(&["snapshot", "ws"]);
        }
        Promise::None => {}
    }
    drop(f);
    // Not fsynced: the growth may be lost, the bytes under it not.
    let grown = match how {
        Grow::Write => {
            let more = random(4000, 2);
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(&more).unwrap();
            [&small[..], &more[..]].concat()
        }
        Grow::Truncate => {
            std::fs::File::options().write(true).open(&path).unwrap().set_len(100_000).unwrap();
            [&small[..], &vec![0u8; 99_000][..]].concat()
        }
        Grow::Copy => {
            let data = random(65536, 3);
            std::fs::write(&big, &data).unwrap();
            copy_range(&big, &path, 65536);
            [&small[..], &vec![0u8; 65536 - 1000][..], &data[..]].concat()
        }
    };
    // A synced RocksDB write by the store's holder, with nothing else synced.
    m.ok(&["volume", "create", "other"]);
    crate::kill(pid);
    assert!(wait_gone(pid, 10), "the mount outlived SIGKILL");
    lazy_unmount(dir.path());
    m.cut_power();

    let got = tempfile::tempdir().unwrap();
    let to = got.path().join("out");
    m.ok(&["export", "ws", to.to_str().unwrap()]);
    let after = std::fs::read(to.join("f")).unwrap();
    // The promised bytes exactly; past them (all of them, when nothing
    // was promised) each byte as grown or lost (zero).
    let promised = if promise == Promise::None { 0 } else { small.len() };
    let kept = after.get(..promised) == Some(&small[..promised]);
    let rest = after.iter().zip(&grown).skip(promised).all(|(a, g)| a == g || *a == 0);
    if !kept || !rest || after.len() > grown.len() {
        let zeros = after.iter().filter(|b| **b == 0).count();
        return Err(format!(
            "{} bytes now ({zeros} zero), the {promised} promised kept: {kept}, the rest as written or zero: {rest}",
            after.len()
        ));
    }
    let (ok, problems) = m.fsck();
    if !ok {
        return Err(format!("fsck: {problems:?}"));
    }
    Ok(())
}

/// copy_file_range of whole blocks from `from` to offset `at` of `to`.
fn copy_range(from: &std::path::Path, to: &std::path::Path, at: i64) {
    use std::os::fd::AsRawFd;
    let src = std::fs::File::open(from).unwrap();
    let dst = std::fs::OpenOptions::new().write(true).open(to).unwrap();
    let (mut off_in, mut off_out) = (0i64, at);
    // SAFETY: both descriptors are open for the call; the offsets are ours.
    let n = unsafe {
        libc::copy_file_range(src.as_raw_fd(), &mut off_in, dst.as_raw_fd(), &mut off_out, 65536, 0)
    };
    assert_eq!(n, 65536, "copy_file_range: {}", std::io::Error::last_os_error());
}
