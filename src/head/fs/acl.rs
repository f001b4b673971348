//! POSIX access control lists, kept as Linux passes them: in the
//! `system.posix_acl_access` and `system.posix_acl_default` attributes
//! (see docs/FORMAT.md). The kernel checks access against them; this
//! module keeps what the filesystem owes, as ext4 does:
//!
//! - setting an access ACL sets the mode's permission bits from it, and an
//!   ACL the mode says in full is not kept;
//! - chmod rewrites the ACL's owner, mask (or group) and other entries;
//! - a new inode in a directory with a default ACL takes it (masked by the
//!   mode asked for) instead of the umask, and a new directory inherits
//!   the default ACL itself.

use crate::error::{Error, Posix, Result};
use bytes::Bytes;

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A parsed ACL: entries in the order the kernel sorts them (owner,
/// named users, owning group, named groups, mask, other).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

fn invalid(why: &str) -> Error {
    Error::posix(Posix::Invalid, format!("bad ACL: {why}"))
}

impl Acl {
    /// Parses and checks an attribute value (EINVAL if it is not a valid
    /// ACL: unknown version or tag, a missing or repeated required entry).
    pub fn parse(v: &[u8]) -> Result<Acl> {
        let (head, body) = v.split_at_checked(4).ok_or_else(|| invalid("too short"))?;
        if u32::from_le_bytes(head.try_into().expect("4 bytes")) != VERSION {
            return Err(invalid("unknown version"));
        }
        if body.is_empty() || body.len() % 8 != 0 {
            return Err(invalid("not a whole number of entries"));
        }
        let entries: Vec<Entry> = body
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let mut last = 0;
        let count = |tag| entries.iter().filter(|e| e.tag == tag).count();
        for e in &entries {
            if e.tag < last
                || e.perm & !7 != 0
                || ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag)
            {
                return Err(invalid("entries out of order, or an unknown tag or permission"));
            }
            last = e.tag;
        }
        let named = count(USER) + count(GROUP);
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 || count(MASK) > 1 {
            return Err(invalid("owner, group and other entries must appear once each"));
        }
        if named > 0 && count(MASK) == 0 {
            return Err(invalid("named entries need a mask"));
        }
        Ok(Acl(entries))
    }

    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(4 + 8 * self.0.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        Bytes::from(out)
    }

    /// The permission bits (0o777) the ACL implies, and whether the mode
    /// says all of it (only owner, group and other entries).
    fn mode(&self) -> (u16, bool) {
        let mut mode = 0;
        let mut equiv = true;
        for e in &self.0 {
            match e.tag {
                USER_OBJ => mode |= e.perm << 6,
                GROUP_OBJ => mode |= e.perm << 3,
                OTHER => mode |= e.perm,
                MASK => {
                    mode = (mode & !0o070) | (e.perm << 3);
                    equiv = false;
                }
                _ => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// chmod: the owner, mask (the group without one) and other entries
    /// take the new permission bits.
    fn chmod(&mut self, perm: u16) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = (perm >> 6) & 7,
                MASK => e.perm = (perm >> 3) & 7,
                GROUP_OBJ if !has_mask => e.perm = (perm >> 3) & 7,
                OTHER => e.perm = perm & 7,
                _ => {}
            }
        }
    }

    /// A new inode's access ACL from its directory's default ACL: each
    /// class narrowed to the mode asked for, and the mode narrowed to the
    /// ACL. Returns the mode and whether the ACL says more than it.
    fn create_masq(&mut self, perm: u16) -> (u16, bool) {
        let mut mode = perm & 0o777;
        let mut equiv = true;
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= (e.perm << 6) | !0o700;
                }
                OTHER => {
                    e.perm &= mode & 7;
                    mode &= e.perm | !0o007;
                }
                MASK | GROUP_OBJ if (e.tag == MASK) == has_mask => {
                    e.perm &= (mode >> 3) & 7;
                    mode &= (e.perm << 3) | !0o070;
                }
                _ => {}
            }
            equiv &= matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER);
        }
        ((perm & !0o777) | (mode & 0o777), equiv)
    }
}

fn find<'a>(xattrs: &'a [(Bytes, Bytes)], name: &[u8]) -> Option<&'a Bytes> {
    xattrs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn put(xattrs: &mut Vec<(Bytes, Bytes)>, name: &[u8], value: Option<Bytes>) {
    let pos = xattrs.iter().position(|(k, _)| k == name);
    match (pos, value) {
        (Some(i), Some(v)) => xattrs[i].1 = v,
        (None, Some(v)) => xattrs.push((Bytes::copy_from_slice(name), v)),
        (Some(i), None) => {
            xattrs.remove(i);
        }
        (None, None) => {}
    }
}

/// An ACL attribute being set on an inode of kind `is_dir` with mode
/// `perm`: the value to keep (None: the mode says it all) and the new mode.
pub fn on_set(name: &[u8], value: &[u8], is_dir: bool, perm: u16) -> Result<(Option<Bytes>, u16)> {
    let acl = Acl::parse(value)?;
    if name == DEFAULT {
        if !is_dir {
            let why = "only directories have a default ACL";
            return Err(Error::posix(Posix::Denied, why));
        }
        return Ok((Some(acl.encode()), perm));
    }
    let (bits, equiv) = acl.mode();
    let perm = (perm & !0o777) | bits;
    Ok(((!equiv).then(|| acl.encode()), perm))
}

/// chmod of an inode: its access ACL follows the new bits.
pub fn on_chmod(xattrs: &mut Vec<(Bytes, Bytes)>, perm: u16) {
    let Some(mut acl) = find(xattrs, ACCESS).and_then(|v| Acl::parse(v).ok()) else { return };
    acl.chmod(perm);
    put(xattrs, ACCESS, Some(acl.encode()));
}

/// A new inode in a directory with attributes `dir_xattrs`: its mode (the
/// umask applies only without a default ACL) and the ACL attributes it
/// starts with. Symlinks take neither.
pub fn on_create(
    dir_xattrs: &[(Bytes, Bytes)],
    is_dir: bool,
    is_symlink: bool,
    perm: u16,
    umask: u16,
) -> (u16, Vec<(Bytes, Bytes)>) {
    if is_symlink {
        return (perm, Vec::new());
    }
    let Some((raw, mut acl)) =
        find(dir_xattrs, DEFAULT).and_then(|v| Some((v.clone(), Acl::parse(v).ok()?)))
    else {
        return (perm & !(umask & 0o777), Vec::new());
    };
    let (mode, equiv) = acl.create_masq(perm);
    let mut xattrs = Vec::new();
    if !equiv {
        xattrs.push((Bytes::from_static(ACCESS), acl.encode()));
    }
    if is_dir {
        xattrs.push((Bytes::from_static(DEFAULT), raw));
    }
    (mode, xattrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let a = Acl(entries.iter().map(|&(tag, perm, id)| Entry { tag, perm, id }).collect());
        a.encode().to_vec()
    }

    const ANY: u32 = u32::MAX;

    #[test]
    fn bad_acls_are_refused() {
        let good = acl(&[(USER_OBJ, 7, ANY), (GROUP_OBJ, 5, ANY), (OTHER, 0, ANY)]);
        assert!(Acl::parse(&good).is_ok());
        for bad in [
            Vec::new(),
            good[..4].to_vec(),
            good[..10].to_vec(),
            [&1u32.to_le_bytes()[..], &good[4..]].concat(),
            acl(&[(USER_OBJ, 7, ANY), (OTHER, 0, ANY)]),
            acl(&[(GROUP_OBJ, 5, ANY), (USER_OBJ, 7, ANY), (OTHER, 0, ANY)]),
            acl(&[(USER_OBJ, 7, ANY), (USER, 7, 5), (GROUP_OBJ, 5, ANY), (OTHER, 0, ANY)]),
            acl(&[(USER_OBJ, 8, ANY), (GROUP_OBJ, 5, ANY), (OTHER, 0, ANY)]),
            acl(&[(USER_OBJ, 7, ANY), (GROUP_OBJ, 5, ANY), (0x40, 0, ANY), (OTHER, 0, ANY)]),
        ] {
            let e = Acl::parse(&bad).unwrap_err();
            assert_eq!(e.posix_condition(), Some(Posix::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn setting_an_acl_sets_the_mode_and_a_plain_one_is_not_kept() {
        let plain = acl(&[(USER_OBJ, 6, ANY), (GROUP_OBJ, 4, ANY), (OTHER, 0, ANY)]);
        assert_eq!(on_set(ACCESS, &plain, false, 0o4777).unwrap(), (None, 0o4640));
        let named = acl(&[
            (USER_OBJ, 6, ANY),
            (USER, 4, 65534),
            (GROUP_OBJ, 4, ANY),
            (MASK, 6, ANY),
            (OTHER, 0, ANY),
        ]);
        let (kept, mode) = on_set(ACCESS, &named, false, 0o600).unwrap();
        assert_eq!((kept.as_deref(), mode), (Some(&named[..]), 0o660), "group bits are the mask");
        let e = on_set(DEFAULT, &named, false, 0o600).unwrap_err();
        assert_eq!(e.posix_condition(), Some(Posix::Denied));
    }

    #[test]
    fn chmod_rewrites_owner_mask_and_other() {
        let named = acl(&[
            (USER_OBJ, 6, ANY),
            (USER, 7, 65534),
            (GROUP_OBJ, 4, ANY),
            (MASK, 7, ANY),
            (OTHER, 4, ANY),
        ]);
        let mut x = vec![(Bytes::from_static(ACCESS), Bytes::from(named))];
        on_chmod(&mut x, 0o751);
        let want = acl(&[
            (USER_OBJ, 7, ANY),
            (USER, 7, 65534),
            (GROUP_OBJ, 4, ANY),
            (MASK, 5, ANY),
            (OTHER, 1, ANY),
        ]);
        assert_eq!(x[0].1, want);
    }

    #[test]
    fn new_inodes_take_the_default_acl_instead_of_the_umask() {
        assert_eq!(on_create(&[], false, false, 0o666, 0o022), (0o644, Vec::new()));
        let default = acl(&[
            (USER_OBJ, 7, ANY),
            (USER, 7, 65534),
            (GROUP_OBJ, 5, ANY),
            (MASK, 7, ANY),
            (OTHER, 0, ANY),
        ]);
        let dir = vec![(Bytes::from_static(DEFAULT), Bytes::from(default.clone()))];
        let (mode, x) = on_create(&dir, false, false, 0o666, 0o077);
        assert_eq!(mode, 0o660, "the umask does not apply; the mask narrows to the mode");
        let access = acl(&[
            (USER_OBJ, 6, ANY),
            (USER, 7, 65534),
            (GROUP_OBJ, 5, ANY),
            (MASK, 6, ANY),
            (OTHER, 0, ANY),
        ]);
        assert_eq!(x, vec![(Bytes::from_static(ACCESS), Bytes::from(access))]);
        let (mode, x) = on_create(&dir, true, false, 0o777, 0o077);
        assert_eq!(mode, 0o770);
        assert_eq!(x.len(), 2, "a directory inherits the default ACL too");
        assert_eq!(x[1].1, default);
        assert_eq!(on_create(&dir, false, true, 0o777, 0o077), (0o777, Vec::new()));
    }
}
