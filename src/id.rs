//! Identifier newtypes: chunk ids, version ids, volume ids and names.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

/// Content address of a chunk: blake3 of its plain (uncompressed) bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    pub fn of(data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    pub fn from_slice(b: &[u8]) -> Result<ChunkId> {
        let arr: [u8; 32] = b.try_into().map_err(|_| Error::corrupt("chunk id is not 32 bytes"))?;
        Ok(ChunkId(arr))
    }

    pub fn parse(s: &str) -> Option<ChunkId> {
        parse_hex::<32>(s).map(ChunkId)
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId(")?;
        write_hex(f, &self.0[..8])?;
        write!(f, ")")
    }
}

impl Serialize for ChunkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ChunkId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ChunkId::parse(&s).ok_or_else(|| serde::de::Error::custom("bad chunk id"))
    }
}

/// Name of a pack object: blake3 of the whole pack (content addressed, immutable).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackId(pub [u8; 16]);

impl PackId {
    pub fn parse(s: &str) -> Option<PackId> {
        parse_hex::<16>(s).map(PackId)
    }
}

impl fmt::Display for PackId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for PackId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackId({self})")
    }
}

/// Identity of an immutable version: blake3 of its record, 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionId(pub [u8; 16]);

impl VersionId {
    pub fn parse(s: &str) -> Option<VersionId> {
        parse_hex::<16>(s).map(VersionId)
    }

    /// The short form shown to people (12 hex digits, like git's abbreviations).
    pub fn short(&self) -> String {
        self.to_string()[..12].to_string()
    }
}

impl fmt::Display for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VersionId({})", self.short())
    }
}

impl Serialize for VersionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VersionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        VersionId::parse(&s).ok_or_else(|| serde::de::Error::custom("bad version id"))
    }
}

/// Internal number of a volume; the key prefix of its overlay. Never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct VolumeId(pub u64);

/// A volume's user-facing name: 1-128 characters of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeName(String);

impl VolumeName {
    pub fn new(s: &str) -> Result<VolumeName> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if s.is_empty() || s.len() > 128 || !s.chars().all(ok_char) || s.starts_with(['.', '-']) {
            return Err(Error::invalid(format!(
                "invalid volume name {s:?}: use 1-128 characters of A-Z a-z 0-9 . _ - (not starting with . or -)"
            )));
        }
        Ok(VolumeName(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for VolumeName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        VolumeName::new(&s)
    }
}

impl From<VolumeName> for String {
    fn from(v: VolumeName) -> String {
        v.0
    }
}

impl fmt::Display for VolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_hex() {
        let c = ChunkId::of(b"hello");
        assert_eq!(ChunkId::parse(&c.to_string()), Some(c));
        let v = VersionId([7; 16]);
        assert_eq!(VersionId::parse(&v.to_string()), Some(v));
        assert_eq!(v.short().len(), 12);
        assert!(ChunkId::parse("zz").is_none());
    }

    #[test]
    fn volume_names_are_checked() {
        assert!(VolumeName::new("web-1.prod_a").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(VolumeName::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
