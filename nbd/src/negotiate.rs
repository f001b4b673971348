//! The handshake: fixed newstyle negotiation up to the transmission phase.
//! Every option gets an answer (unknown ones NBD_REP_ERR_UNSUP); only a
//! broken framing (bad magic, oversized junk) or ABORT ends the connection.

use crate::export::{Export, refusal};
use crate::exports::Exports;
use crate::proto::consts::{MAX_OPTION_DATA_LEN, OPTION_HEADER_LEN};
use crate::proto::{
    self, HandshakeFlags, InfoType, OptionReplyType, OptionType, TransmissionFlags,
};
use forkfs::VersionRecord;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Option data beyond this is not even drained: the connection is closed.
const MAX_DRAIN: u64 = 16 << 20;
pub const CHANGED_SINCE: &str = "forkfs:changed-since:";
pub const ALLOCATION: &str = "base:allocation";

/// A metadata context a client selected; its id is its index + 1.
#[derive(Clone, Debug)]
pub enum MetaContext {
    Allocation,
    ChangedSince(VersionRecord),
}

/// What the option haggling came to.
pub enum Outcome {
    /// Attach to an export.
    Attach(Negotiated),
    /// The client left (ABORT, or EOF).
    Left,
    /// STARTTLS was acknowledged: the caller upgrades the connection, then
    /// runs [`options`] again over TLS (the spec starts the options over).
    StartTls,
}

/// TLS as the option loop sees it.
#[derive(Clone, Debug, Default)]
pub struct TlsState {
    /// The server has TLS, and so requires it.
    pub required: bool,
    /// This connection is upgraded already.
    pub active: bool,
    /// The client certificate's identity (its SHA-256 fingerprint), once
    /// upgraded with one: what `--allow-client` rules name.
    pub client: Option<String>,
}

/// What the handshake agreed on.
pub struct Negotiated {
    pub export: Arc<Export>,
    pub structured: bool,
    pub contexts: Vec<MetaContext>,
}

pub fn transmission_flags(e: &Export) -> TransmissionFlags {
    let mut f = TransmissionFlags::HAS_FLAGS
        .union(TransmissionFlags::SEND_FLUSH)
        .union(TransmissionFlags::SEND_FUA)
        .union(TransmissionFlags::SEND_CACHE)
        .union(TransmissionFlags::SEND_DF)
        // One process serves every connection from one shared head, and a
        // flush syncs all of them: consistent across connections.
        .union(TransmissionFlags::CAN_MULTI_CONN);
    if e.read_only {
        f.insert(TransmissionFlags::READ_ONLY);
    } else {
        f.insert(TransmissionFlags::SEND_TRIM);
        f.insert(TransmissionFlags::SEND_WRITE_ZEROES);
        f.insert(TransmissionFlags::SEND_FAST_ZERO);
    }
    f
}

/// Opens an export, or says how to refuse it: the option reply (by the
/// error's kind, [`refusal`]) and a message for the client's user.
async fn open(
    exports: &Arc<Exports>,
    name: &str,
    tls: &TlsState,
) -> Result<Arc<Export>, (OptionReplyType, String)> {
    if let Err(why) = exports.client_may(name, tls.client.as_deref()) {
        tracing::warn!(export = name, client = tls.client.as_deref(), "{why}");
        return Err((OptionReplyType::ErrPolicy, why));
    }
    let (ex, n) = (exports.clone(), name.to_string());
    match tokio::task::spawn_blocking(move || ex.open(&n)).await {
        Ok(Ok(e)) => Ok(e),
        Ok(Err(e)) => {
            tracing::info!(export = name, error = %e, "export refused");
            Err((refusal(&e), forkfs::one_line(&e)))
        }
        Err(e) => Err((OptionReplyType::ErrUnknown, e.to_string())),
    }
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> std::io::Result<()> {
    s.write_all(buf).await?;
    buf.clear();
    Ok(())
}

/// Sends the greeting and reads the client's flags; whether the client
/// wants no zeroes after an EXPORT_NAME reply.
pub async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> std::io::Result<bool> {
    let mut out = Vec::with_capacity(32);
    let server_flags = HandshakeFlags::FIXED_NEWSTYLE.union(HandshakeFlags::NO_ZEROES);
    proto::encode_greeting(&mut out, server_flags);
    send(s, &mut out).await?;
    let mut cf = [0u8; 4];
    s.read_exact(&mut cf).await?;
    let client = proto::decode_client_flags(&cf, server_flags).map_err(invalid)?;
    Ok(client.contains(proto::ClientFlags::NO_ZEROES))
}

/// Answers options until the client attaches, leaves or starts TLS.
/// `max_request` is advertised as the largest payload (NBD_INFO_BLOCK_SIZE).
/// A server with TLS answers nothing but STARTTLS and ABORT before it.
pub async fn options<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    exports: &Arc<Exports>,
    max_request: u32,
    no_zeroes: bool,
    tls: TlsState,
) -> std::io::Result<Outcome> {
    let mut out = Vec::with_capacity(256);
    let mut structured = false;
    let mut contexts: Vec<MetaContext> = Vec::new();
    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        match s.read_exact(&mut hdr).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Outcome::Left),
            Err(e) => return Err(e),
        }
        let (option, len) = match proto::decode_option_header(&hdr) {
            Ok(h) => (h.option, h.len),
            Err(proto::ProtoError::OptionTooBig { option, len }) => {
                if u64::from(len) > MAX_DRAIN {
                    return Err(invalid("option data too large to drain"));
                }
                tokio::io::copy(&mut (&mut *s).take(u64::from(len)), &mut tokio::io::sink())
                    .await?;
                proto::encode_rep_error(
                    &mut out,
                    option.into(),
                    OptionReplyType::ErrTooBig,
                    "option data too large",
                );
                send(s, &mut out).await?;
                continue;
            }
            Err(e) => return Err(invalid(e)),
        };
        debug_assert!(len <= MAX_OPTION_DATA_LEN);
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).await?;
        let err =
            |out: &mut Vec<u8>, kind, msg: &str| proto::encode_rep_error(out, option, kind, msg);
        if tls.required && !tls.active {
            match option {
                OptionType::StartTls | OptionType::Abort => {}
                // No way to refuse politely here: the protocol closes.
                OptionType::ExportName => return Err(invalid("TLS is required")),
                _ => {
                    err(
                        &mut out,
                        OptionReplyType::ErrTlsReqd,
                        "TLS is required (NBD_OPT_STARTTLS)",
                    );
                    send(s, &mut out).await?;
                    continue;
                }
            }
        }
        match option {
            OptionType::StartTls if tls.required => {
                if tls.active {
                    err(&mut out, OptionReplyType::ErrInvalid, "TLS is on already");
                } else if !data.is_empty() {
                    err(&mut out, OptionReplyType::ErrInvalid, "STARTTLS takes no data");
                } else {
                    proto::encode_rep_ack(&mut out, option);
                    send(s, &mut out).await?;
                    return Ok(Outcome::StartTls);
                }
            }
            OptionType::ExportName => {
                let name = proto::parse_export_name(&data).map_err(invalid)?;
                // No way to refuse politely here: the protocol closes.
                let export = open(exports, &name, &tls).await.map_err(|(_, msg)| invalid(msg))?;
                proto::encode_export_name_reply(
                    &mut out,
                    export.size,
                    transmission_flags(&export),
                    no_zeroes,
                );
                send(s, &mut out).await?;
                return Ok(Outcome::Attach(Negotiated { export, structured, contexts }));
            }
            OptionType::Abort => {
                proto::encode_rep_ack(&mut out, option);
                let _ = send(s, &mut out).await;
                return Ok(Outcome::Left);
            }
            OptionType::List => {
                if !data.is_empty() {
                    err(&mut out, OptionReplyType::ErrInvalid, "LIST takes no data");
                } else {
                    let (ex, who) = (exports.clone(), tls.client.clone());
                    let list = tokio::task::spawn_blocking(move || ex.list(who.as_deref()))
                        .await
                        .map_err(invalid)?;
                    match list {
                        Ok(list) => {
                            for (name, desc) in list {
                                proto::encode_rep_server(&mut out, &name, &desc)
                                    .map_err(invalid)?;
                            }
                            proto::encode_rep_ack(&mut out, option);
                        }
                        Err(e) => err(&mut out, OptionReplyType::ErrPlatform, &e.to_string()),
                    }
                }
            }
            OptionType::StructuredReply => {
                if !data.is_empty() {
                    err(&mut out, OptionReplyType::ErrInvalid, "STRUCTURED_REPLY takes no data");
                } else {
                    structured = true;
                    proto::encode_rep_ack(&mut out, option);
                }
            }
            OptionType::Info | OptionType::Go => {
                let req = match proto::parse_info_request(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        err(&mut out, OptionReplyType::ErrInvalid, &e.to_string());
                        send(s, &mut out).await?;
                        continue;
                    }
                };
                match open(exports, &req.name, &tls).await {
                    Err((kind, msg)) => err(&mut out, kind, &msg),
                    Ok(export) => {
                        proto::encode_info_export(
                            &mut out,
                            option,
                            export.size,
                            transmission_flags(&export),
                        );
                        if req.wants(InfoType::Name) {
                            proto::encode_info_name(&mut out, option, &export.name)
                                .map_err(invalid)?;
                        }
                        if req.wants(InfoType::Description) {
                            proto::encode_info_description(&mut out, option, &export.description)
                                .map_err(invalid)?;
                        }
                        // Sent whether asked for or not (the spec allows
                        // it): qemu and libnbd size their requests by it.
                        let sizes = proto::BlockSizes {
                            min: 1,
                            preferred: preferred(export.block_size, max_request),
                            max: max_request,
                        };
                        proto::encode_info_block_size(&mut out, option, sizes);
                        proto::encode_rep_ack(&mut out, option);
                        if option == OptionType::Go {
                            send(s, &mut out).await?;
                            return Ok(Outcome::Attach(Negotiated {
                                export,
                                structured,
                                contexts,
                            }));
                        }
                    }
                }
            }
            OptionType::ListMetaContext | OptionType::SetMetaContext => {
                let set = option == OptionType::SetMetaContext;
                match proto::parse_meta_context_request(&data) {
                    Err(e) => err(&mut out, OptionReplyType::ErrInvalid, &e.to_string()),
                    Ok(_) if set && !structured => err(
                        &mut out,
                        OptionReplyType::ErrInvalid,
                        "negotiate structured replies first",
                    ),
                    Ok(req) => match open(exports, &req.export, &tls).await {
                        Err((kind, msg)) => err(&mut out, kind, &msg),
                        Ok(export) => {
                            let found = match_contexts(&export, &req.queries, set).await;
                            if set {
                                contexts = found.iter().map(|(c, _)| c.clone()).collect();
                            }
                            for (i, (_, name)) in found.iter().enumerate() {
                                let id = if set { i as u32 + 1 } else { 0 };
                                proto::encode_rep_meta_context(&mut out, option, id, name)
                                    .map_err(invalid)?;
                            }
                            proto::encode_rep_ack(&mut out, option);
                        }
                    },
                }
            }
            _ => err(&mut out, OptionReplyType::ErrUnsup, "option not supported"),
        }
        send(s, &mut out).await?;
    }
}

/// The contexts matching the client's queries (all of ours for an empty LIST).
async fn match_contexts(
    export: &Arc<Export>,
    queries: &[String],
    set: bool,
) -> Vec<(MetaContext, String)> {
    let mut found = Vec::new();
    if queries.is_empty() && !set {
        found.push((MetaContext::Allocation, ALLOCATION.to_string()));
        return found;
    }
    for q in queries {
        if q == ALLOCATION || (!set && q == "base:") {
            found.push((MetaContext::Allocation, ALLOCATION.to_string()));
        } else if let Some(spec) = q.strip_prefix(CHANGED_SINCE).filter(|s| !s.is_empty()) {
            let (ex, spec) = (export.clone(), spec.to_string());
            if let Ok(Ok(v)) = tokio::task::spawn_blocking(move || ex.resolve_version(&spec)).await
            {
                found.push((MetaContext::ChangedSince(v), q.clone()));
            }
        }
    }
    found
}

/// The preferred block size: the export's, unless over the maximum
/// (then the largest power of two under it, as the spec wants one).
fn preferred(block_size: u32, max_request: u32) -> u32 {
    if block_size <= max_request { block_size } else { 1 << (31 - max_request.leading_zeros()) }
}

pub fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}
