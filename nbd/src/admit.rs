//! Admission: at most `--max-connections` connections at once. One over
//! the limit is still answered, so its user learns why: it gets the
//! greeting, and every option it sends (up to a few) is refused with
//! NBD_REP_ERR_POLICY and a message naming the limit; then it is closed.
//! NBD_OPT_EXPORT_NAME has no error reply, so it is just closed. Refusals
//! are bounded in number and time too: beyond them, a connection is
//! closed at once.

use crate::proto::consts::OPTION_HEADER_LEN;
use crate::proto::{self, HandshakeFlags, OptionReplyType, OptionType};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Refusals answered at once; more connections are closed without a word.
const MAX_REFUSING: usize = 64;
/// Options answered on a refused connection before it is closed.
const MAX_REFUSED_OPTIONS: usize = 16;
/// Option data a refused connection may send (drained, not kept).
const MAX_REFUSED_DATA: u32 = 64 << 10;
/// How long a refused connection may take.
const REFUSAL_TIME: Duration = Duration::from_secs(5);

/// Counts the connections of a server.
pub struct Admission {
    slots: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    max: usize,
}

/// What to do with a new connection.
pub enum Admit {
    /// Serve it, holding the slot for as long as it lives.
    Serve(OwnedSemaphorePermit),
    /// Tell it why not, holding a refusal slot.
    Refuse(OwnedSemaphorePermit),
    /// Close it now.
    Close,
}

impl Admission {
    pub fn new(max: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(max)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            max,
        }
    }

    pub fn admit(&self) -> Admit {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            Admit::Serve(p)
        } else if let Ok(p) = self.refusing.clone().try_acquire_owned() {
            Admit::Refuse(p)
        } else {
            Admit::Close
        }
    }

    /// Connections served now.
    pub fn in_use(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// A slot to refuse a connection for another reason (see
    /// [`refuse`]); `None`: too many refusals at once, close it.
    pub fn refusal(&self) -> Option<OwnedSemaphorePermit> {
        self.refusing.clone().try_acquire_owned().ok()
    }

    pub fn message(&self) -> String {
        format!("server busy: it serves at most {} connections (--max-connections)", self.max)
    }
}

/// Answers a connection over the limit with `message` (see the module
/// header), within [`REFUSAL_TIME`].
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, message: String) {
    let _ = tokio::time::timeout(REFUSAL_TIME, refusal(&mut s, &message)).await;
    let _ = s.shutdown().await;
}

async fn refusal<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    message: &str,
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(256);
    let flags = HandshakeFlags::FIXED_NEWSTYLE.union(HandshakeFlags::NO_ZEROES);
    proto::encode_greeting(&mut out, flags);
    s.write_all(&out).await?;
    let mut cf = [0u8; 4];
    s.read_exact(&mut cf).await?;
    for _ in 0..MAX_REFUSED_OPTIONS {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        s.read_exact(&mut hdr).await?;
        let (option, len) = match proto::decode_option_header(&hdr) {
            Ok(h) => (h.option, h.len),
            Err(_) => return Ok(()),
        };
        if len > MAX_REFUSED_DATA || option == OptionType::ExportName {
            return Ok(());
        }
        tokio::io::copy(&mut (&mut *s).take(u64::from(len)), &mut tokio::io::sink()).await?;
        out.clear();
        if option == OptionType::Abort {
            proto::encode_rep_ack(&mut out, option);
            return s.write_all(&out).await;
        }
        // A client that got the error for GO says ABORT (libnbd does);
        // closing first would leave it with EPIPE instead of the reason.
        proto::encode_rep_error(&mut out, option, OptionReplyType::ErrPolicy, message);
        s.write_all(&out).await?;
    }
    Ok(())
}
