//! The FUSE operations of [`LazyFs`](super::LazyFs): namespace changes
//! go to the backing directory at once, file data waits in memory until
//! fsync.

use super::*;

impl Filesystem for LazyFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.entry(p)) {
            Ok(a) => reply.entry(&TTL, &a, self.generation(a.ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path_of(ino.0).and_then(|p| self.entry(p)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let run = || -> Result<FileAttr, Errno> {
            let rel = self.path_of(ino.0)?;
            let full = self.full(&rel);
            if let Some(m) = mode {
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(m & 0o7777))
                    .map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&full, uid, gid).map_err(errno)?;
            }
            if let Some(size) = size {
                // A size change is file data: lost unless synced.
                let backing = std::fs::metadata(&full).map_err(errno)?.len();
                let mut st = self.state.lock();
                let d = st.dirty_of(ino.0, backing);
                d.size = size;
                d.pages.retain(|idx, _| idx * PAGE < size);
                if let Some(p) = d.pages.get_mut(&(size / PAGE)) {
                    p[(size % PAGE) as usize..].fill(0);
                }
                if size < backing && !d.pages.contains_key(&(size / PAGE)) && size % PAGE != 0 {
                    // The bytes past the new end must read as zeros if it grows again.
                    let mut page = vec![0u8; PAGE as usize];
                    let f = File::open(&full).map_err(errno)?;
                    let at = size / PAGE * PAGE;
                    let n = f.read_at(&mut page[..(size - at) as usize], at).map_err(errno)?;
                    page[n..].fill(0);
                    d.pages.insert(size / PAGE, page);
                }
            }
            self.entry(rel)
        };
        match run() {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.path_of(ino.0).and_then(|p| std::fs::read_link(self.full(&p)).map_err(errno)) {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let run = || -> Result<FileAttr, Errno> {
            let rel = self.child(parent, name)?;
            let full = self.full(&rel);
            std::fs::create_dir(&full).map_err(errno)?;
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode & 0o7777))
                .map_err(errno)?;
            self.entry(rel)
        };
        match run() {
            Ok(a) => reply.entry(&TTL, &a, self.generation(a.ino.0)),
            Err(e) => reply.error(e),
        }
    }

    /// Sockets (the store's control socket) and fifos.
    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let run = || -> Result<FileAttr, Errno> {
            let rel = self.child(parent, name)?;
            let full = std::ffi::CString::new(self.full(&rel).into_os_string().into_vec())
                .map_err(|_| Errno::EINVAL)?;
            // SAFETY: mknod(2) on a NUL-terminated path this function owns.
            let rc =
                unsafe { libc::mknod(full.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) };
            if rc != 0 {
                return Err(errno(std::io::Error::last_os_error()));
            }
            self.entry(rel)
        };
        match run() {
            Ok(a) => reply.entry(&TTL, &a, self.generation(a.ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let run = || -> Result<(), Errno> {
            let full = self.full(&self.child(parent, name)?);
            let m = std::fs::symlink_metadata(&full).map_err(errno)?;
            std::fs::remove_file(&full).map_err(errno)?;
            self.forget_if_gone(m.ino(), m.nlink() - 1);
            Ok(())
        };
        match run() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(self.full(&p)).map_err(errno))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let run = || -> Result<FileAttr, Errno> {
            let rel = self.child(parent, link_name)?;
            std::os::unix::fs::symlink(target, self.full(&rel)).map_err(errno)?;
            self.entry(rel)
        };
        match run() {
            Ok(a) => reply.entry(&TTL, &a, self.generation(a.ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let run = || -> Result<(), Errno> {
            let noreplace = flags.bits() == libc::RENAME_NOREPLACE;
            let (from, to) = (self.child(parent, name)?, self.child(newparent, newname)?);
            if flags.bits() == libc::RENAME_EXCHANGE {
                return self.exchange(&from, &to);
            }
            if flags.bits() != 0 && !noreplace {
                return Err(Errno::EINVAL);
            }
            let replaced = std::fs::symlink_metadata(self.full(&to)).ok();
            if noreplace && replaced.is_some() {
                return Err(Errno::EEXIST);
            }
            std::fs::rename(self.full(&from), self.full(&to)).map_err(errno)?;
            if let Some(m) = replaced.filter(|m| !m.is_dir()) {
                self.forget_if_gone(m.ino(), m.nlink() - 1);
            }
            // Known paths under the old name follow it.
            let mut st = self.state.lock();
            for p in st.paths.values_mut() {
                if let Ok(rest) = p.strip_prefix(&from) {
                    *p = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
                }
            }
            Ok(())
        };
        match run() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let run = || -> Result<FileAttr, Errno> {
            let (from, to) = (self.path_of(ino.0)?, self.child(newparent, newname)?);
            std::fs::hard_link(self.full(&from), self.full(&to)).map_err(errno)?;
            self.entry(to)
        };
        match run() {
            Ok(a) => reply.entry(&TTL, &a, self.generation(a.ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0, flags.0) {
            Ok(fh) => reply.opened(fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let run = || -> Result<(FileAttr, FileHandle), Errno> {
            let rel = self.child(parent, name)?;
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(true).create(true).mode(mode & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            drop(o.open(self.full(&rel)).map_err(errno)?);
            let attr = self.entry(rel)?;
            let fh = self.open_file(attr.ino.0, libc::O_RDWR)?;
            Ok((attr, fh))
        };
        match run() {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, self.generation(a.ino.0), fh, FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let run = || -> Result<Vec<u8>, Errno> {
            let (ino, f) = self.handle(fh)?;
            let backing = f.metadata().map_err(errno)?.len();
            let st = self.state.lock();
            if st.read_fails(ino) {
                return Err(Errno::EIO);
            }
            let d = st.dirty.get(&ino);
            let len = d.map_or(backing, |d| d.size);
            if offset >= len {
                return Ok(Vec::new());
            }
            let n = (len - offset).min(size as u64) as usize;
            let mut buf = vec![0u8; n];
            if offset < backing {
                let m = ((backing - offset) as usize).min(n);
                f.read_exact_at(&mut buf[..m], offset).map_err(errno)?;
            }
            if let Some(d) = d {
                for (idx, page) in d.pages.range(offset / PAGE..=(offset + n as u64 - 1) / PAGE) {
                    let at = idx * PAGE;
                    let from = offset.max(at);
                    let to = (offset + n as u64).min(at + PAGE);
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&page[(from - at) as usize..(to - at) as usize]);
                }
            }
            Ok(buf)
        };
        match run() {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let run = || -> Result<(), Errno> {
            let (ino, f) = self.handle(fh)?;
            let backing = f.metadata().map_err(errno)?.len();
            let mut st = self.state.lock();
            if st.write_fails(ino) {
                return Err(Errno::EIO);
            }
            let d = st.dirty_of(ino, backing);
            let end = offset + data.len() as u64;
            let mut at = offset;
            while at < end {
                let idx = at / PAGE;
                let page = match d.pages.get_mut(&idx) {
                    Some(p) => p,
                    None => {
                        // The page as the file holds it, below the current size.
                        let mut p = vec![0u8; PAGE as usize];
                        let start = idx * PAGE;
                        let upto = backing.min(d.size);
                        if start < upto {
                            let m = ((upto - start).min(PAGE)) as usize;
                            f.read_exact_at(&mut p[..m], start).map_err(errno)?;
                        }
                        d.pages.entry(idx).or_insert(p)
                    }
                };
                let within = (at % PAGE) as usize;
                let n = ((PAGE as usize) - within).min((end - at) as usize);
                let src = (at - offset) as usize;
                page[within..within + n].copy_from_slice(&data[src..src + n]);
                at += n as u64;
            }
            d.size = d.size.max(end);
            Ok(())
        };
        match run() {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) syncs nothing.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let closed = self.state.lock().handles.remove(&fh.0);
        if let Some((ino, f)) = closed {
            self.forget_if_gone(ino, f.metadata().map_or(1, |m| m.nlink()));
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let synced = self.handle(fh).and_then(|(ino, f)| {
            if self.state.lock().write_fails(ino) {
                return Err(Errno::EIO);
            }
            self.sync_ino(ino, &f)
        });
        match synced {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let run = || -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
            let rel = self.path_of(ino.0)?;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(self.full(&rel)).map_err(errno)? {
                let e = e.map_err(errno)?;
                let m = e.metadata().map_err(errno)?;
                out.push((m.ino(), kind_of(&m), e.file_name()));
            }
            Ok(out)
        };
        match run() {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = CString::new(self.backing.as_os_str().as_bytes()).expect("no NUL in the path");
        // SAFETY: statvfs writes into the zeroed struct we own.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(Errno::EIO);
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            255,
            s.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Reserving space changes nothing a reader sees; growing is a write.
        let run = || -> Result<(), Errno> {
            if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                let (ino, f) = self.handle(fh)?;
                let backing = f.metadata().map_err(errno)?.len();
                let mut st = self.state.lock();
                let d = st.dirty_of(ino, backing);
                d.size = d.size.max(offset + length);
            }
            Ok(())
        };
        match run() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
