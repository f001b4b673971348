//! A TLS connection's bytes to and from the session: the session's
//! request threads read and write a blocking socket, and TLS needs one
//! owner for both directions of its state, so the connection's thread
//! decrypts into one end of a Unix socket pair and encrypts what comes
//! out of it; the session serves the other end as it serves a plain
//! socket.

use super::wire::Wire;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bytes moved at a time from the session to the client (TLS records
/// are up to 16 KiB).
const RELAY_BUFFER: usize = 64 << 10;

/// The two copies between a TLS stream and the session's socket.
pub struct Relay {
    up: JoinHandle<()>,
    down: JoinHandle<()>,
}

/// Starts relaying `tls`; the returned socket is the session's end.
pub fn start<S>(tls: S) -> std::io::Result<(Wire, Relay)>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    theirs.set_nonblocking(true)?;
    let theirs = tokio::net::UnixStream::from_std(theirs)?;
    let (mut from_client, mut to_client) = tokio::io::split(tls);
    let (from_session, mut to_session) = theirs.into_split();
    // Requests: until the client's EOF (passed on as the session's) or
    // the session stops reading (its end shut for reading).
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_session).await;
        let _ = to_session.shutdown().await;
    });
    // Replies: until the session's last thread closes its end; then
    // TLS's close_notify.
    let down = tokio::spawn(async move {
        let mut from_session = BufReader::with_capacity(RELAY_BUFFER, from_session);
        let _ = tokio::io::copy_buf(&mut from_session, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    Ok((Wire::Unix(ours), Relay { up, down }))
}

impl Relay {
    /// Waits until the replies are out, or until `grace` after a stop (a
    /// client that does not read them), then drops the connection.
    pub async fn finish(self, mut stop: watch::Receiver<bool>, grace: Duration) {
        let Relay { up, mut down } = self;
        tokio::select! {
            _ = &mut down => {}
            _ = stop.wait_for(|s| *s) => {
                if tokio::time::timeout(grace, &mut down).await.is_err() {
                    down.abort();
                }
            }
        }
        up.abort();
    }
}
