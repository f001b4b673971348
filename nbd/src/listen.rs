//! Where the server may listen. Without client certificates (TLS with
//! `--tls-client-ca`, `tls.rs`) whoever reaches a TCP listener reads and
//! writes every served disk: only loopback addresses are allowed then,
//! unless the operator says `--insecure-listen`. Unix sockets are always
//! allowed (their file mode guards them).

use std::net::{SocketAddr, ToSocketAddrs};

/// What listens, for the messages of [`check`].
#[derive(Clone, Copy)]
pub enum Listener {
    /// `--listen` (or a TCP socket passed by the service manager): client
    /// certificates make a public address safe.
    Nbd,
    /// `--metrics`: it has no authentication at all.
    Metrics,
}

/// Checks a listening address: every address it resolves to must be
/// loopback, unless `insecure` (or, for NBD, clients are authenticated).
/// The error is one line and says what to do.
pub fn check(addr: &str, insecure: bool, what: Listener) -> forkfs::Result<()> {
    let (flag, exposed, fix) = match what {
        Listener::Nbd => (
            "--listen",
            "without client certificates anyone who reaches it could read and write every \
             served disk",
            "give --tls-cert, --tls-key and --tls-client-ca, or pass --insecure-listen",
        ),
        Listener::Metrics => (
            "--metrics",
            "the metrics endpoint has no authentication",
            "pass --insecure-listen to expose it",
        ),
    };
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| forkfs::Error::invalid(format!("bad {flag} address {addr:?}: {e}")))?
        .collect();
    if insecure {
        return Ok(());
    }
    match resolved.iter().find(|a| !a.ip().to_canonical().is_loopback()) {
        None if !resolved.is_empty() => Ok(()),
        found => Err(forkfs::Error::invalid(format!(
            "refusing to listen on {addr}{}: not a loopback address, and {exposed}; {fix}",
            found.map(|a| format!(" ({})", a.ip())).unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::{Listener, check};

    #[test]
    fn only_loopback_unless_insecure() {
        for ok in ["127.0.0.1:10809", "[::1]:10809", "127.0.0.2:0", "[::ffff:127.0.0.1]:1"] {
            assert!(check(ok, false, Listener::Nbd).is_ok(), "{ok}");
        }
        for bad in ["0.0.0.0:10809", "[::]:10809", "192.0.2.7:10809", "[2001:db8::1]:1"] {
            let e = check(bad, false, Listener::Nbd).unwrap_err();
            assert_eq!(e.kind(), forkfs::ErrorKind::InvalidInput, "{bad}");
            assert!(e.to_string().contains("--tls-client-ca"), "{e}");
            assert!(!e.to_string().contains('\n'), "{e}");
            let m = check(bad, false, Listener::Metrics).unwrap_err().to_string();
            assert!(m.contains("--insecure-listen") && !m.contains("--tls"), "{m}");
            assert!(check(bad, true, Listener::Nbd).is_ok(), "{bad}");
        }
        let e = check("no port", true, Listener::Metrics).unwrap_err().to_string();
        assert!(e.contains("bad --metrics address"), "{e}");
    }
}
