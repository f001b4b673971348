//! Inode flags through ioctl (`chattr`, `lsattr`, `xfs_io -c chattr`):
//! FS_IOC_GETFLAGS/SETFLAGS and FS_IOC_FSGETXATTR/FSSETXATTR.

use super::Fuse;
use forkfs::{Error, Posix};
use fuser::Request;

impl Fuse {
    /// Answers an inode-flag ioctl on `ino`: the bytes to return, or
    /// `None` for any other ioctl (ENOTTY). Whether the caller may set
    /// the flags is checked by the kernel first and again here.
    pub(super) fn flags_ioctl(
        &self,
        req: &Request,
        ino: u64,
        cmd: u32,
        in_data: &[u8],
    ) -> Option<Result<Vec<u8>, Error>> {
        // FS_IOC_GETFLAGS and FS_IOC_SETFLAGS; FS_IOC_FSGETXATTR and
        // FS_IOC_FSSETXATTR (struct fsxattr, the same flags as "xflags";
        // the kernel reads them before a set). The kernel checks these
        // native numbers itself (owner, CAP_LINUX_IMMUTABLE) before they
        // arrive; other numbers reach a filesystem unchecked, so the
        // 32-bit forms are refused, and the checks are made again below.
        // _IOR('f', 1, long) and _IOW('f', 2, long): the size of a long.
        const LONG: u32 = (std::mem::size_of::<libc::c_long>() as u32) << 16;
        const GET: [u32; 1] = [0x8000_6601 | LONG];
        const SET: [u32; 1] = [0x4000_6602 | LONG];
        const FSGETXATTR: u32 = 0x801c_581f;
        const FSSETXATTR: u32 = 0x401c_5820;
        let set = |flags: Result<u32, Error>| -> Result<Vec<u8>, Error> {
            let (head, own, flags) = (self.ws.head()?, self.ws.own(ino)?, flags?);
            let i = self.ws.inode(own)?;
            let root = req.uid() == 0;
            let locks = forkfs::fs::FL_IMMUTABLE | forkfs::fs::FL_APPEND;
            if !root && (req.uid() != i.uid || (i.flags ^ flags) & locks != 0) {
                let why = "only the owner sets inode flags, and only root immutable or append-only";
                return Err(Error::posix(Posix::NotPermitted, why));
            }
            head.set_flags(own, flags)?;
            self.attrs_set(ino, Some(i.kind));
            Ok(Vec::new())
        };
        let bad = || Err(Error::posix(Posix::Invalid, "ioctl argument too short"));
        let r = match cmd {
            c if GET.contains(&c) => self.ws.stat(ino).map(|(i, _)| i.flags.to_le_bytes().to_vec()),
            FSGETXATTR => self.ws.stat(ino).map(|(i, _)| {
                let mut fsx = vec![0u8; 28];
                fsx[..4].copy_from_slice(&xflags_of(i.flags).to_le_bytes());
                fsx
            }),
            c if SET.contains(&c) => match in_data.first_chunk::<4>() {
                Some(b) => set(Ok(u32::from_le_bytes(*b))),
                None => bad(),
            },
            FSSETXATTR => match in_data.first_chunk::<28>() {
                Some(b) => set(flags_of_fsxattr(b)),
                None => bad(),
            },
            _ => return None,
        };
        Some(r)
    }
}

/// Inode flags and the xflags of `struct fsxattr` that say the same.
const XFLAGS: [(u32, u32); 4] = [
    (forkfs::fs::FL_IMMUTABLE, 0x8),
    (forkfs::fs::FL_APPEND, 0x10),
    (forkfs::fs::FL_NOATIME, 0x40),
    (forkfs::fs::FL_NODUMP, 0x80),
];

fn xflags_of(flags: u32) -> u32 {
    XFLAGS.iter().filter(|(f, _)| flags & f != 0).map(|(_, x)| x).sum()
}

/// The inode flags a `struct fsxattr` asks for: EOPNOTSUPP for an xflag
/// without one, or for extent sizes and project ids (not kept).
fn flags_of_fsxattr(fsx: &[u8; 28]) -> Result<u32, Error> {
    let word = |i: usize| u32::from_le_bytes(fsx[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (xflags, extsize, projid, cowextsize) = (word(0), word(1), word(3), word(4));
    let known: u32 = XFLAGS.iter().map(|(_, x)| x).sum();
    if xflags & !known != 0 || extsize != 0 || projid != 0 || cowextsize != 0 {
        let why = "only the immutable, append, noatime and nodump xflags are kept";
        return Err(Error::posix(Posix::Unsupported, why));
    }
    Ok(XFLAGS.iter().filter(|(_, x)| xflags & x != 0).map(|(f, _)| f).sum())
}
