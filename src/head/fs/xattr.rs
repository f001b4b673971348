//! Extended attributes of fs volume inodes, kept in the inode record.

use super::FsHead;
use super::acl;
use super::inode::FileKind;
use super::inode::Inode;
use super::reader::FsReader;
use crate::error::{Error, Posix, Result};
use bytes::Bytes;

/// Longest attribute name (XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest attribute value (XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65_536;
/// All of one inode's attributes together, names and values.
pub const XATTR_TOTAL_MAX: usize = 256 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Set,
    /// XATTR_CREATE: EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: ENODATA if it does not.
    Replace,
}

fn no_attr(name: &[u8]) -> Error {
    Error::posix(Posix::NoAttr, format!("no attribute {}", String::from_utf8_lossy(name)))
}

fn check_attr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Error::posix(Posix::Range, "attribute name must be 1-255 bytes"));
    }
    Ok(())
}

impl FsReader<'_> {
    pub fn xattr(&self, ino: u64, name: &[u8]) -> Result<Bytes> {
        let inode = self.inode(ino)?;
        find(&inode, name).ok_or_else(|| no_attr(name))
    }

    /// Attribute names, in the order they were set.
    pub fn xattr_names(&self, ino: u64) -> Result<Vec<Bytes>> {
        Ok(self.inode(ino)?.xattrs.into_iter().map(|(k, _)| k).collect())
    }
}

fn find(inode: &Inode, name: &[u8]) -> Option<Bytes> {
    inode.xattrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

impl FsHead {
    pub fn set_xattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        check_attr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::posix(Posix::TooBig, "attribute value larger than 64 KiB"));
        }
        self.inode_txn(ino, |inode| {
            inode.check_mutable()?;
            let pos = inode.xattrs.iter().position(|(k, _)| k == name);
            match (mode, pos) {
                (XattrMode::Create, Some(_)) => {
                    let why = format!("attribute {} exists", String::from_utf8_lossy(name));
                    return Err(Error::posix(Posix::Exists, why));
                }
                (XattrMode::Replace, None) => return Err(no_attr(name)),
                _ => {}
            }
            let value = if name == acl::ACCESS || name == acl::DEFAULT {
                let is_dir = inode.kind == FileKind::Dir;
                let (kept, perm) = acl::on_set(name, value, is_dir, inode.perm)?;
                inode.perm = perm;
                match kept {
                    Some(v) => v,
                    None => {
                        // The mode says it all: no attribute, as on ext4.
                        pos.map(|i| inode.xattrs.remove(i));
                        return Ok(());
                    }
                }
            } else {
                Bytes::copy_from_slice(value)
            };
            let entry = (Bytes::copy_from_slice(name), value);
            match pos {
                Some(i) => inode.xattrs[i] = entry,
                None => inode.xattrs.push(entry),
            }
            let total: usize = inode.xattrs.iter().map(|(k, v)| k.len() + v.len()).sum();
            if total > XATTR_TOTAL_MAX {
                return Err(Error::posix(Posix::NoSpace, "no room for more attributes"));
            }
            Ok(())
        })
    }

    pub fn remove_xattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        check_attr_name(name)?;
        self.inode_txn(ino, |inode| {
            inode.check_mutable()?;
            let pos = inode.xattrs.iter().position(|(k, _)| k == name);
            inode.xattrs.remove(pos.ok_or_else(|| no_attr(name))?);
            Ok(())
        })
    }
}
