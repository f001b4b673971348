//! Who may connect over the Unix socket: with `--allow-uid` or
//! `--allow-gid`, only processes whose user or primary group (as the
//! kernel reports them, SO_PEERCRED) is listed; the socket file's mode is
//! the first guard, this the second. A refused process gets the greeting
//! and NBD_REP_ERR_POLICY with the reason (`admit.rs`). TCP clients are
//! authenticated by their certificates instead (`tls.rs`).

/// The Unix socket's allowlist; empty: every process that can open the
/// socket.
#[derive(Clone, Debug, Default)]
pub struct Peers {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl Peers {
    /// Why the process at the other end of `s` may not connect, if it
    /// may not.
    pub fn refuses(&self, s: &tokio::net::UnixStream) -> Option<String> {
        if self.uids.is_empty() && self.gids.is_empty() {
            return None;
        }
        let Ok(cred) = s.peer_cred() else {
            return Some("the peer's credentials are unknown (SO_PEERCRED)".into());
        };
        let (uid, gid) = (cred.uid(), cred.gid());
        if self.uids.contains(&uid) || self.gids.contains(&gid) {
            return None;
        }
        Some(format!("uid {uid} (gid {gid}) may not connect: not in --allow-uid or --allow-gid"))
    }
}
