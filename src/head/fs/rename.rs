//! rename(2) on an fs volume, with RENAME_NOREPLACE and RENAME_EXCHANGE,
//! as one transaction (both names change together or neither does).

use super::inode::{FileKind, Inode, ROOT_INO};
use super::ops::RenameMode;
use super::txn::{Txn, name_of};
use crate::error::{Error, Posix, Result};

pub(super) fn rename(
    t: &mut Txn<'_>,
    (dir, name): (u64, &[u8]),
    (new_dir, new_name): (u64, &[u8]),
    mode: RenameMode,
    open: &dyn Fn(u64) -> bool,
) -> Result<()> {
    let from_dir = t.dir(dir)?;
    let src_e = t.entry(dir, name)?;
    let to_dir = t.dir(new_dir)?;
    let dst_e = t.find(new_dir, new_name)?;
    if dir == new_dir && name == new_name {
        return Ok(());
    }
    match (mode, &dst_e) {
        (RenameMode::NoReplace, Some(_)) => {
            return Err(Error::posix(Posix::Exists, format!("{} exists", name_of(new_name))));
        }
        (RenameMode::Exchange, None) => {
            let why = format!("{}: no such file or directory", name_of(new_name));
            return Err(Error::posix(Posix::NoEntry, why));
        }
        _ => {}
    }
    let src = t.inode(src_e.ino)?;
    if dst_e.as_ref().is_some_and(|d| d.ino == src.ino) {
        // Two links of one file: rename(2) does nothing.
        return Ok(());
    }
    // A name leaves `dir` (and one in `new_dir`, if replaced): neither may
    // be immutable or append-only, nor may what they name; a name only
    // added needs a directory that is not immutable.
    from_dir.check_mutable()?;
    match dst_e {
        Some(_) => to_dir.check_mutable()?,
        None => to_dir.check_not_immutable()?,
    }
    src.check_mutable()?;
    if src.kind == FileKind::Dir && dir != new_dir {
        not_below(t, src.ino, new_dir)?;
    }
    if let Some(d) = dst_e {
        let dst = t.inode(d.ino)?;
        dst.check_mutable()?;
        if mode == RenameMode::Exchange {
            return exchange(t, (dir, name, src), (new_dir, new_name, dst));
        }
        match (src.kind == FileKind::Dir, dst.kind == FileKind::Dir) {
            (true, false) => {
                let why = format!("{} is not a directory", name_of(new_name));
                return Err(Error::posix(Posix::NotDir, why));
            }
            (false, true) => {
                let why = format!("{} is a directory", name_of(new_name));
                return Err(Error::posix(Posix::IsDir, why));
            }
            (true, true) if !t.r.is_empty(&dst)? => {
                let why = format!("{} is not empty", name_of(new_name));
                return Err(Error::posix(Posix::NotEmpty, why));
            }
            _ => {}
        }
        t.remove_entry(new_dir, new_name)?;
        if dst.kind == FileKind::Dir {
            add_links(t, new_dir, -1)?;
        }
        t.unlink_inode(dst, (new_dir, new_name), open)?;
    }
    t.remove_entry(dir, name)?;
    t.add_entry(new_dir, new_name, src.ino, src.kind)?;
    if src.kind == FileKind::Dir && dir != new_dir {
        add_links(t, dir, -1)?;
        add_links(t, new_dir, 1)?;
    }
    moved(t, src, (dir, name), (new_dir, new_name));
    t.touch_dir(dir)?;
    t.touch_dir(new_dir)
}

/// RENAME_EXCHANGE: each name now names the other's inode.
fn exchange(
    t: &mut Txn<'_>,
    (dir, name, a): (u64, &[u8], Inode),
    (new_dir, new_name, b): (u64, &[u8], Inode),
) -> Result<()> {
    if b.kind == FileKind::Dir && dir != new_dir {
        not_below(t, b.ino, dir)?;
    }
    t.add_entry(dir, name, b.ino, b.kind)?;
    t.add_entry(new_dir, new_name, a.ino, a.kind)?;
    if dir != new_dir {
        let delta = (a.kind == FileKind::Dir) as i64 - (b.kind == FileKind::Dir) as i64;
        add_links(t, dir, -delta)?;
        add_links(t, new_dir, delta)?;
    }
    moved(t, a, (dir, name), (new_dir, new_name));
    moved(t, b, (new_dir, new_name), (dir, name));
    t.touch_dir(dir)?;
    t.touch_dir(new_dir)
}

/// Records that `inode`'s link `from` is now `to` (its ctime changes).
fn moved(t: &mut Txn<'_>, mut inode: Inode, from: (u64, &[u8]), to: (u64, &[u8])) {
    inode.move_link(from, to);
    inode.ctime = t.now;
    t.put(inode);
}

fn add_links(t: &mut Txn<'_>, dir: u64, delta: i64) -> Result<()> {
    let mut d = t.dir(dir)?;
    d.nlink = (d.nlink as i64 + delta).max(0) as u32;
    t.put(d);
    Ok(())
}

/// EINVAL if `dir` is `ino` or below it (a directory moved into itself).
fn not_below(t: &mut Txn<'_>, ino: u64, mut dir: u64) -> Result<()> {
    for _ in 0..1_000_000 {
        if dir == ino {
            let why = "cannot move a directory into itself or below itself";
            return Err(Error::posix(Posix::Invalid, why));
        }
        if dir == ROOT_INO {
            return Ok(());
        }
        dir = t.inode(dir)?.parent;
    }
    Err(Error::corrupt("directory parent pointers form a cycle"))
}
