//! Where the server may listen. Without client certificates (TLS with
//! `--tls-client-ca`, `tls.rs`) whoever reaches a TCP listener reads and
//! writes every served disk: only loopback addresses are allowed then,
//! unless the operator says `--insecure-listen`. Unix sockets are always
//! allowed (their file mode guards them).

use std::net::{SocketAddr, ToSocketAddrs};

/// Checks `--listen ADDR`: every address it resolves to must be loopback,
/// unless `insecure` (or clients are authenticated). The error is one line and says what to do.
pub fn check(addr: &str, insecure: bool) -> forkfs::Result<()> {
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| forkfs::Error::invalid(format!("bad --listen address {addr:?}: {e}")))?
        .collect();
    if insecure {
        return Ok(());
    }
    match resolved.iter().find(|a| !a.ip().to_canonical().is_loopback()) {
        None if !resolved.is_empty() => Ok(()),
        found => Err(forkfs::Error::invalid(format!(
            "refusing to listen on {addr}{}: not a loopback address, and without client \
             certificates anyone who reaches it could read and write every served disk; \
             give --tls-cert, --tls-key and --tls-client-ca, or pass --insecure-listen",
            found.map(|a| format!(" ({})", a.ip())).unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn only_loopback_unless_insecure() {
        for ok in ["127.0.0.1:10809", "[::1]:10809", "127.0.0.2:0", "[::ffff:127.0.0.1]:1"] {
            assert!(check(ok, false).is_ok(), "{ok}");
        }
        for bad in ["0.0.0.0:10809", "[::]:10809", "192.0.2.7:10809", "[2001:db8::1]:1"] {
            let e = check(bad, false).unwrap_err();
            assert_eq!(e.kind(), forkfs::ErrorKind::InvalidInput, "{bad}");
            assert!(e.to_string().contains("--insecure-listen"), "{e}");
            assert!(!e.to_string().contains('\n'), "{e}");
            assert!(check(bad, true).is_ok(), "{bad}");
        }
        assert!(check("no port", true).is_err());
    }
}
