//! Parsers for client option payloads (`NBD_OPT_EXPORT_NAME`,
//! `NBD_OPT_INFO`/`NBD_OPT_GO`, `NBD_OPT_LIST_META_CONTEXT`/
//! `NBD_OPT_SET_META_CONTEXT`) plus matching client-side encoders.
//!
//! Parsers take exactly the option data announced by the option header.
//! Every length field is checked against the bytes actually present, so a
//! malformed payload yields a [`ProtoError`] (reply `NBD_REP_ERR_INVALID`)
//! and never a panic or an allocation larger than the payload itself.

use super::error::ProtoError;
use super::types::InfoType;
use super::wire::{Reader, check_out_string, decode_string, len_u32};

/// Parses `NBD_OPT_EXPORT_NAME` data: the whole payload is the export name
/// (empty means the default export).
pub fn parse_export_name(data: &[u8]) -> Result<String, ProtoError> {
    decode_string(data, "export name")
}

/// Payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name (empty means the default export).
    pub name: String,
    /// Information items requested, in client order (may be empty;
    /// unknown items are kept as [`InfoType::Unknown`] and must be ignored).
    pub requests: Vec<InfoType>,
}

impl InfoRequest {
    /// Whether the client asked for `info`.
    pub fn wants(&self, info: InfoType) -> bool {
        self.requests.contains(&info)
    }
}

/// Parses `NBD_OPT_INFO` / `NBD_OPT_GO` data: name length u32, name,
/// request count u16, then that many u16 info types, and nothing more.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    const WHAT: &str = "info request";
    let mut r = Reader::new(data);
    let name = r.string32(WHAT)?;
    let count = usize::from(r.u16(WHAT)?);
    let list = r.take(count * 2, WHAT)?;
    r.finish(WHAT)?;
    let requests = list
        .chunks_exact(2)
        .map(|pair| InfoType::from(u16::from_be_bytes([pair[0], pair[1]])))
        .collect();
    Ok(InfoRequest { name, requests })
}

/// Appends `NBD_OPT_INFO` / `NBD_OPT_GO` data (client side).
pub fn encode_info_request(
    out: &mut Vec<u8>,
    name: &str,
    requests: &[InfoType],
) -> Result<(), ProtoError> {
    check_out_string(name, "export name")?;
    let count = u16::try_from(requests.len())
        .map_err(|_| ProtoError::PayloadTooLarge { what: "info request", len: requests.len() })?;
    out.extend_from_slice(&len_u32(name.len(), "export name")?.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    for &info in requests {
        out.extend_from_slice(&u16::from(info).to_be_bytes());
    }
    Ok(())
}

/// Payload of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: String,
    /// Queries such as `base:allocation` or `base:` (may be empty).
    pub queries: Vec<String>,
}

/// Parses meta-context option data: export name length u32, name, query
/// count u32, then each query as length u32 + string, and nothing more.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, ProtoError> {
    const WHAT: &str = "meta context request";
    let mut r = Reader::new(data);
    let export = r.string32(WHAT)?;
    let count = r.u32(WHAT)?;
    // Each query needs at least its 4-byte length, so a count larger than
    // that is malformed; checking first also bounds the allocation below.
    if u64::from(count) * 4 > r.remaining() as u64 {
        return Err(ProtoError::Truncated { what: WHAT });
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        queries.push(r.string32(WHAT)?);
    }
    r.finish(WHAT)?;
    Ok(MetaContextRequest { export, queries })
}

/// Appends meta-context option data (client side).
pub fn encode_meta_context_request(
    out: &mut Vec<u8>,
    export: &str,
    queries: &[&str],
) -> Result<(), ProtoError> {
    check_out_string(export, "export name")?;
    for query in queries {
        check_out_string(query, "meta context query")?;
    }
    let count = len_u32(queries.len(), "meta context request")?;
    out.extend_from_slice(&len_u32(export.len(), "export name")?.to_be_bytes());
    out.extend_from_slice(export.as_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    for query in queries {
        out.extend_from_slice(&len_u32(query.len(), "meta context query")?.to_be_bytes());
        out.extend_from_slice(query.as_bytes());
    }
    Ok(())
}
