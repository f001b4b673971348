//! Conversions between the core's fs types and FUSE's: attributes, file
//! types, times, and the one place core errors become errnos.

use forkfs::fs::{FileKind, Inode, Time};
use forkfs::{Error, ErrorKind, Posix};
use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::UNIX_EPOCH;

pub fn errno(e: &Error) -> Errno {
    let code = match e.posix_condition() {
        Some(p) => match p {
            Posix::NoEntry => libc::ENOENT,
            Posix::Exists => libc::EEXIST,
            Posix::NotEmpty => libc::ENOTEMPTY,
            Posix::IsDir => libc::EISDIR,
            Posix::NotDir => libc::ENOTDIR,
            Posix::NameTooLong => libc::ENAMETOOLONG,
            Posix::Invalid => libc::EINVAL,
            Posix::NotPermitted => libc::EPERM,
            Posix::Denied => libc::EACCES,
            Posix::NoAttr => libc::ENODATA,
            Posix::TooBig => libc::E2BIG,
            Posix::Range => libc::ERANGE,
            Posix::FileTooBig => libc::EFBIG,
            Posix::TooManyLinks => libc::EMLINK,
            Posix::Unsupported => libc::EOPNOTSUPP,
            Posix::NoSpace => libc::ENOSPC,
            Posix::NoSuchAddress => libc::ENXIO,
        },
        None => match e.kind() {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::ReadOnly => libc::EROFS,
            ErrorKind::NoSpace => libc::ENOSPC,
            ErrorKind::InvalidInput => libc::EINVAL,
            ErrorKind::Conflict => libc::EBUSY,
            ErrorKind::Corrupt | ErrorKind::Unavailable => {
                tracing::error!(error = %e, "I/O error");
                libc::EIO
            }
        },
    };
    Errno::from_i32(code)
}

pub fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// The kind of a `mode` from mknod/create (S_IFMT bits).
pub fn kind_of_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => return None,
    })
}

/// A time the kernel sent (setattr). fuser 0.18 turns the kernel's
/// (secs < 0, nsec) into `UNIX_EPOCH - (-secs s + nsec ns)`, which is
/// wrong for sub-second times before 1970 (-1.2 s, sent as (-2, 8e8),
/// arrives as -2.8 s); its mapping is one-to-one, so it is undone here.
pub fn kernel_time(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::Now => Time::now(),
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(_) => Time::of(t),
            Err(e) if e.duration().as_secs() == 0 => Time::of(t),
            Err(e) => {
                let d = e.duration();
                Time { secs: -(d.as_secs() as i64), nanos: d.subsec_nanos() }
            }
        },
    }
}

/// FUSE attributes of an inode, under FUSE inode number `ino`, with
/// `allocated` bytes (st_blocks counts 512-byte units of them).
pub fn attr(i: &Inode, ino: u64, blksize: u32, allocated: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: i.size,
        blocks: allocated.div_ceil(512),
        atime: i.atime.to_system(),
        mtime: i.mtime.to_system(),
        ctime: i.ctime.to_system(),
        crtime: i.crtime.to_system(),
        kind: file_type(i.kind),
        perm: i.perm,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize,
        flags: 0,
    }
}

/// The attributes of a LOOKUP reply that names no inode (node id 0): a
/// negative entry, which the kernel keeps for the entry's TTL. The kernel
/// reads nothing else of them.
pub fn no_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn kernel_times_survive_fusers_pre_epoch_conversion() {
        // What fuser 0.18 makes of the kernel's (secs, nsec).
        let fuser = |secs: i64, nsec: u32| {
            if secs >= 0 {
                UNIX_EPOCH + Duration::new(secs as u64, nsec)
            } else {
                UNIX_EPOCH - Duration::new((-secs) as u64, nsec)
            }
        };
        for (secs, nanos) in [(0, 0), (5, 7), (-1, 0), (-2, 800_000_000), (-86_400, 500)] {
            let got = kernel_time(TimeOrNow::SpecificTime(fuser(secs, nanos)));
            assert_eq!(got, Time { secs, nanos }, "kernel ({secs}, {nanos})");
        }
    }
}
