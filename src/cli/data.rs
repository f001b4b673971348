//! `forkfs import` and `forkfs export`: raw images for block volumes,
//! directory trees for fs volumes.

use super::Global;
use super::output::{bytes, print_json, progress};
use anyhow::Context;
use forkfs::fs::{Content, FileKind, FsReader, Inode, NewNode, ROOT_INO, SetAttr, Time};
use forkfs::{
    BlockHead, Error, FsHead, Opened, Origin, SnapshotOptions, Target, VolumeKind, is_zero,
};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const IO_CHUNK: usize = 4 << 20;

#[derive(clap::Args)]
pub struct ImportArgs {
    /// Volume to import into (created when missing)
    volume: String,
    /// A raw image file (block volume) or a directory (fs volume)
    source: PathBuf,
    /// Do not snapshot after importing
    #[arg(long)]
    no_snapshot: bool,
}

pub fn import(g: &Global, a: ImportArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let meta = std::fs::metadata(&a.source)
        .with_context(|| format!("cannot read {}", a.source.display()))?;
    let volumes = store.volumes();
    let (kind, created) = match volumes.get(&a.volume) {
        Ok(v) => (v.kind, false),
        Err(e) if e.kind() == forkfs::ErrorKind::NotFound => {
            let v = if meta.is_dir() {
                volumes.create(&a.volume, VolumeKind::Fs, None, None)?
            } else {
                let bs = store.config().default_block_size as u64;
                let len = image_len(&a.source)?;
                let size = len.div_ceil(bs).max(1) * bs;
                volumes.create(&a.volume, VolumeKind::Block, Some(size), None)?
            };
            (v.kind, true)
        }
        Err(e) => return Err(e.into()),
    };
    // The head stays open until the snapshot: on a remote store its lease
    // must not be let go in between.
    let (copied, _open): (u64, Box<dyn std::any::Any>) = match (kind, meta.is_dir()) {
        (VolumeKind::Block, false) => {
            let head = volumes.open_block(&a.volume)?;
            let n = import_image(&head, &a.source, created)?;
            if a.no_snapshot {
                head.flush()?;
            }
            (n, Box::new(head))
        }
        (VolumeKind::Fs, true) => {
            let head = volumes.open_fs(&a.volume)?;
            let mut n = 0;
            if created {
                // The tree's top directory is the volume's.
                let m = std::fs::metadata(&a.source)?;
                let top = SetAttr {
                    perm: Some((m.mode() & 0o7777) as u16),
                    uid: Some(m.uid()),
                    gid: Some(m.gid()),
                    ..Default::default()
                };
                head.set_attr(ROOT_INO, &top)?;
            }
            import_dir(&head, ROOT_INO, &a.source, &mut n)?;
            if a.no_snapshot {
                head.flush()?;
            }
            (n, Box::new(head))
        }
        (VolumeKind::Block, true) => {
            return Err(
                Error::invalid("a block volume imports a raw image file, not a directory").into()
            );
        }
        (VolumeKind::Fs, false) => {
            return Err(Error::invalid("an fs volume imports a directory, not a file").into());
        }
    };
    let version = if a.no_snapshot {
        None
    } else {
        let label = format!("import {}", a.source.display());
        let opts = SnapshotOptions {
            label: Some(label),
            origin: Some(Origin::Import),
            ..Default::default()
        };
        Some(store.graph().snapshot(&a.volume, &opts)?)
    };
    if g.json {
        return print_json(
            &serde_json::json!({ "volume": a.volume, "bytes": copied, "version": version.map(|v| v.id) }),
        );
    }
    match version {
        Some(v) => println!("imported {} into {}@{}", bytes(copied), a.volume, v.id.short()),
        None => println!("imported {} into {}", bytes(copied), a.volume),
    }
    Ok(())
}

fn image_len(p: &Path) -> anyhow::Result<u64> {
    let mut f = File::open(p)?;
    Ok(f.seek(SeekFrom::End(0))?)
}

fn import_image(head: &BlockHead, src: &Path, fresh: bool) -> anyhow::Result<u64> {
    let len = image_len(src)?;
    if len > head.size() {
        return Err(Error::invalid(format!(
            "{} is {} but the volume holds {}",
            src.display(),
            bytes(len),
            bytes(head.size())
        ))
        .into());
    }
    let mut f = File::open(src)?;
    let bs = head.record().block_size as usize;
    let bar = progress(len, "import");
    let mut buf = vec![0u8; IO_CHUNK];
    let mut off = 0u64;
    while off < len {
        // Holes of a sparse image are skipped without reading them.
        let data = next_data(&f, off, len) / bs as u64 * bs as u64;
        if data > off {
            if !fresh {
                head.write_zeroes(off, data - off)?;
            }
            off = data;
            bar.set_position(off);
            continue;
        }
        f.seek(std::io::SeekFrom::Start(off))?;
        let n = ((len - off) as usize).min(IO_CHUNK);
        f.read_exact(&mut buf[..n])?;
        // Zero blocks are holes: a fresh volume skips them, an old one drops its data there.
        for (i, block) in buf[..n].chunks(bs).enumerate() {
            let at = off + (i * bs) as u64;
            if is_zero(block) {
                if !fresh {
                    head.write_zeroes(at, block.len() as u64)?;
                }
            } else {
                head.write_at(at, block)?;
            }
        }
        off += n as u64;
        bar.set_position(off);
    }
    bar.finish_and_clear();
    Ok(len)
}

/// The first offset at or after `off` that may hold data (`len` when only
/// a hole follows); `off` itself where the filesystem cannot tell.
fn next_data(f: &File, off: u64, len: u64) -> u64 {
    use std::os::fd::AsRawFd;
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    if r >= 0 {
        (r as u64).min(len)
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
        len
    } else {
        off
    }
}

fn time_of(secs: i64, nanos: i64) -> Time {
    Time { secs, nanos: nanos.clamp(0, 999_999_999) as u32 }
}

fn import_dir(head: &FsHead, dir: u64, src: &Path, copied: &mut u64) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let m = std::fs::symlink_metadata(&path)?;
        let name = e.file_name();
        let name = name.as_bytes().to_vec();
        let ft = m.file_type();
        let owner = (m.uid(), m.gid());
        let perm = (m.mode() & 0o7777) as u16;
        let inode = if ft.is_dir() {
            let i = head.create(dir, &name, FileKind::Dir, perm, owner, None)?;
            import_dir(head, i.ino, &path, copied)?;
            i
        } else if ft.is_symlink() {
            let t = std::fs::read_link(&path)?;
            let t = t.as_os_str().as_bytes().to_vec();
            head.create(dir, &name, FileKind::Symlink, 0o777, owner, Some(&t))?
        } else if ft.is_file() {
            let i = head.create(dir, &name, FileKind::File, perm, owner, None)?;
            let mut f =
                File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let mut buf = vec![0u8; IO_CHUNK];
            let mut off = 0u64;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                head.write_file(i.ino, off, &buf[..n])?;
                off += n as u64;
            }
            *copied += off;
            i
        } else {
            // Device numbers come along; one that does not fit the
            // inode record's 32 bits is refused, not truncated.
            let rdev = u32::try_from(m.rdev()).map_err(|_| {
                forkfs::Error::invalid(format!("{}: device number too large", path.display()))
            })?;
            let node = NewNode {
                kind: special_kind(&m),
                perm,
                uid: owner.0,
                gid: owner.1,
                target: None,
                rdev,
                umask: 0,
            };
            head.make(dir, &name, &node)?
        };
        let times = SetAttr {
            atime: Some(time_of(m.atime(), m.atime_nsec())),
            mtime: Some(time_of(m.mtime(), m.mtime_nsec())),
            ..Default::default()
        };
        head.set_attr(inode.ino, &times)?;
    }
    Ok(())
}

fn special_kind(m: &std::fs::Metadata) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    let ft = m.file_type();
    if ft.is_fifo() {
        FileKind::Fifo
    } else if ft.is_socket() {
        FileKind::Socket
    } else if ft.is_char_device() {
        FileKind::CharDev
    } else {
        FileKind::BlockDev
    }
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// VOL (the live head) or VOL@VERSION
    source: String,
    /// Raw image file (block) or directory (fs) to create
    dest: PathBuf,
    /// Overwrite an existing image file
    #[arg(long)]
    force: bool,
}

pub fn export(g: &Global, a: ExportArgs) -> anyhow::Result<()> {
    let store = g.open()?;
    let target = store.graph().resolve(&a.source)?;
    let kind = match &target {
        Target::Version(v) => v.kind,
        Target::Head(v) => v.kind,
    };
    let copied = match kind {
        VolumeKind::Block => export_image(&store.graph().open_block(&target)?, &a.dest, a.force)?,
        VolumeKind::Fs => {
            if a.dest.exists() && std::fs::read_dir(&a.dest)?.next().is_some() {
                return Err(Error::conflict(format!(
                    "{} exists and is not empty",
                    a.dest.display()
                ))
                .into());
            }
            std::fs::create_dir_all(&a.dest)?;
            let opened = store.graph().open_fs(&target)?;
            let reader = opened.reader();
            let mut n = 0;
            let root = reader.inode(ROOT_INO)?;
            export_dir(&reader, &root, &a.dest, &mut n)?;
            n
        }
    };
    if g.json {
        return print_json(
            &serde_json::json!({ "source": a.source, "dest": a.dest, "bytes": copied }),
        );
    }
    println!("exported {} to {}", bytes(copied), a.dest.display());
    Ok(())
}

fn export_image(source: &Opened<BlockHead>, dest: &Path, force: bool) -> anyhow::Result<u64> {
    let (size, bs) = source.geometry();
    let bs = bs as u64;
    let blocks = source.allocated_blocks_in(0, u64::MAX)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if force {
        opts.create(true).truncate(true)
    } else {
        opts.create_new(true)
    };
    let f = opts.open(dest).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AlreadyExists {
            " (use --force to overwrite)"
        } else {
            ""
        };
        anyhow::Error::new(e).context(format!("cannot create {}{hint}", dest.display()))
    })?;
    let written = (|| -> anyhow::Result<()> {
        f.set_len(size)?;
        let bar = progress(blocks.len() as u64 * bs, "export");
        let mut buf = vec![0u8; bs as usize];
        for (i, b) in blocks.iter().enumerate() {
            let off = b * bs;
            source.read_at(off, &mut buf)?;
            f.write_all_at(&buf, off)?;
            bar.set_position((i as u64 + 1) * bs);
        }
        f.sync_all()?;
        bar.finish_and_clear();
        Ok(())
    })();
    if written.is_err() {
        // No partial image is left where a whole one was asked for.
        drop(f);
        let _ = std::fs::remove_file(dest);
    }
    written.map(|()| size)
}

fn export_dir(r: &FsReader<'_>, dir: &Inode, dest: &Path, copied: &mut u64) -> anyhow::Result<()> {
    for (_, e) in r.list(dir, 0)? {
        let name = OsStr::from_bytes(&e.name);
        let path = dest.join(name);
        let inode = r.inode(e.ino)?;
        match inode.kind {
            FileKind::Dir => {
                std::fs::create_dir(&path)?;
                export_dir(r, &inode, &path, copied)?;
            }
            FileKind::File => {
                let mut f = File::create(&path)?;
                let mut buf = vec![0u8; IO_CHUNK];
                let mut off = 0u64;
                while off < inode.size {
                    let n = r.read(&inode, off, &mut buf)?;
                    f.write_all(&buf[..n])?;
                    off += n as u64;
                }
                f.set_modified(inode.mtime.to_system())?;
                *copied += inode.size;
            }
            FileKind::Symlink => {
                let Content::Target(t) = &inode.content else {
                    return Err(Error::corrupt(format!("symlink {} has no target", e.ino)).into());
                };
                std::os::unix::fs::symlink(OsStr::from_bytes(t), &path)?;
                continue;
            }
            _ => {
                eprintln!("forkfs: skipping special file {}", path.display());
                continue;
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(inode.perm as u32))?;
    }
    Ok(())
}
