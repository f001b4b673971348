//! `forkfs import` and `forkfs export`: raw images for block volumes,
//! directory trees for fs volumes.

use super::Global;
use super::output::{bytes, print_json, progress};
use anyhow::Context;
use forkfs::volume::block::{allocated_in_version, read_version};
use forkfs::volume::fs::{FsReader, SetAttr, reader_for_version};
use forkfs::volume::inode::{Content, FileKind, Inode, ROOT_INO, Time};
use forkfs::volume::is_zero;
use forkfs::{Error, Head, Origin, SnapshotOptions, Store, Target, VolumeKind};
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
    let created = match store.volume(&a.volume) {
        Ok(_) => false,
        Err(e) if e.kind() == forkfs::ErrorKind::NotFound => {
            if meta.is_dir() {
                store.create_volume(&a.volume, VolumeKind::Fs, None, None)?;
            } else {
                let bs = store.config().default_block_size as u64;
                let len = image_len(&a.source)?;
                let size = len.div_ceil(bs).max(1) * bs;
                store.create_volume(&a.volume, VolumeKind::Block, Some(size), None)?;
            }
            true
        }
        Err(e) => return Err(e.into()),
    };
    let head = store.open_volume(&a.volume)?;
    let copied = match (head.kind(), meta.is_dir()) {
        (VolumeKind::Block, false) => import_image(&head, &a.source, created)?,
        (VolumeKind::Fs, true) => {
            let mut n = 0;
            import_dir(&head, ROOT_INO, &a.source, &mut n)?;
            n
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
        head.flush()?;
        None
    } else {
        let label = format!("import {}", a.source.display());
        let opts = SnapshotOptions {
            label: Some(label),
            origin: Some(Origin::Import),
            ..Default::default()
        };
        Some(store.snapshot(&a.volume, &opts)?)
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

fn import_image(head: &Head, src: &Path, fresh: bool) -> anyhow::Result<u64> {
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

fn import_dir(head: &Head, dir: u64, src: &Path, copied: &mut u64) -> anyhow::Result<()> {
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
            let node = forkfs::volume::fsops::NewNode {
                kind: special_kind(&m),
                perm,
                uid: owner.0,
                gid: owner.1,
                target: None,
                rdev,
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
    let target = store.resolve(&a.source)?;
    let (kind, version, head) = match &target {
        Target::Version(v) => (v.kind, Some(v.clone()), None),
        Target::Head(v) => (v.kind, None, Some(store.open_volume(v.name.as_str())?)),
    };
    let copied = match kind {
        VolumeKind::Block => {
            export_image(&store, version.as_ref(), head.as_deref(), &a.dest, a.force)?
        }
        VolumeKind::Fs => {
            if a.dest.exists() && std::fs::read_dir(&a.dest)?.next().is_some() {
                return Err(Error::conflict(format!(
                    "{} exists and is not empty",
                    a.dest.display()
                ))
                .into());
            }
            std::fs::create_dir_all(&a.dest)?;
            let reader: FsReader<'_> = match (&version, &head) {
                (Some(v), _) => reader_for_version(&store, v.root, v.block_size),
                (None, Some(h)) => h.fs(),
                _ => unreachable!("a target is a version or a head"),
            };
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

fn export_image(
    store: &Store,
    version: Option<&forkfs::VersionRecord>,
    head: Option<&Head>,
    dest: &Path,
    force: bool,
) -> anyhow::Result<u64> {
    let (size, bs, blocks) = match (version, head) {
        (Some(v), _) => (v.size, v.block_size as u64, allocated_in_version(store, v)?),
        (None, Some(h)) => (h.size(), h.record().block_size as u64, h.allocated_blocks()?),
        _ => unreachable!("a target is a version or a head"),
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if force {
        opts.create(true).truncate(true)
    } else {
        opts.create_new(true)
    };
    let f = opts
        .open(dest)
        .with_context(|| format!("cannot create {} (use --force to overwrite)", dest.display()))?;
    f.set_len(size)?;
    let bar = progress(blocks.len() as u64 * bs, "export");
    let mut buf = vec![0u8; bs as usize];
    for (i, b) in blocks.iter().enumerate() {
        let off = b * bs;
        match (version, head) {
            (Some(v), _) => read_version(store, v, off, &mut buf)?,
            (None, Some(h)) => h.read_at(off, &mut buf)?,
            _ => unreachable!(),
        }
        f.write_all_at(&buf, off)?;
        bar.set_position((i as u64 + 1) * bs);
    }
    f.sync_all()?;
    bar.finish_and_clear();
    Ok(size)
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
