//! Running under a service manager (systemd, or anything that speaks its
//! protocols): listening sockets passed by socket activation
//! (`LISTEN_FDS`, `sd_listen_fds(3)`) and readiness notification
//! (`NOTIFY_SOCKET`, `sd_notify(3)`). `docs/systemd/` has the units, and
//! `docs/OPERATIONS.md` how to run them.

use std::os::fd::{FromRawFd, OwnedFd};

/// A listening socket the service manager passed.
pub enum Inherited {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// The listening sockets passed to this process by socket activation
/// (none when it was not socket-activated). A descriptor that is not a
/// TCP or Unix stream socket is a configuration error.
pub fn listeners() -> forkfs::Result<Vec<Inherited>> {
    let fds = sd_notify::listen_fds()
        .map_err(|e| forkfs::Error::invalid(format!("LISTEN_FDS from the service manager: {e}")))?;
    let mut out = Vec::new();
    for fd in fds {
        // SAFETY: socket activation hands descriptors 3.. (as many as
        // LISTEN_FDS says, LISTEN_PID naming this process) to this
        // process to own; nothing else in it uses them.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        if !listening(&sock) {
            return Err(forkfs::Error::invalid(format!(
                "descriptor {fd} from the service manager (LISTEN_FDS) is not a listening stream \
                 socket (use Accept=no)"
            )));
        }
        out.push(match family(&sock) {
            Some(libc::AF_UNIX) => Inherited::Unix(sock.into()),
            Some(libc::AF_INET | libc::AF_INET6) => Inherited::Tcp(sock.into()),
            _ => {
                return Err(forkfs::Error::invalid(format!(
                    "descriptor {fd} from the service manager (LISTEN_FDS) is not a TCP or Unix \
                     socket"
                )));
            }
        });
    }
    Ok(out)
}

/// The address family of socket `fd` (`None`: not a socket).
fn family(fd: &OwnedFd) -> Option<i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: getsockname writes at most `len` bytes into the zeroed
    // storage this function owns.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut addr).cast(), &mut len) };
    (rc == 0).then_some(addr.ss_family as i32)
}

/// Whether `fd` is a socket that listens (SO_ACCEPTCONN): not a
/// connection (`Accept=yes`) or a datagram socket.
fn listening(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `on`, owned here.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut on).cast(),
            &mut len,
        )
    };
    rc == 0 && on == 1
}

/// Tells the service manager the server accepts connections (a no-op
/// without `NOTIFY_SOCKET`).
pub fn ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "readiness not sent to the service manager (NOTIFY_SOCKET)");
    }
}

/// Tells the service manager the server is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}
