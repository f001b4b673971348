//! A fault-injecting TCP proxy between nbdfuse and the server: it copies
//! bytes both ways, and [`Proxy::cut`] shuts every proxied connection down
//! in both directions at once, wherever the NBD conversation happens to be
//! (mid-request, mid-reply, with FLUSHes in flight). The server sees its
//! connections end without NBD_CMD_DISC; the client sees EOF.

use parking_lot::Mutex;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Proxy {
    pub port: u16,
    /// Both sockets of every connection proxied since the last cut.
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

/// A port that was free a moment ago (the server binds it with SO_REUSEADDR).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    // One direction ended: end the whole connection, as a broken link would.
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (conns.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                else {
                    continue; // the server is down: the client sees the connection close
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                {
                    let mut reg = c.lock();
                    reg.push(client.try_clone().unwrap());
                    reg.push(server.try_clone().unwrap());
                }
                std::thread::spawn(move || pipe(client, s2));
                std::thread::spawn(move || pipe(server, c2));
            }
        });
        Proxy { port, conns, stop, accept: Some(accept) }
    }

    /// Cuts every open connection; returns how many sockets were shut down.
    pub fn cut(&self) -> usize {
        let socks = std::mem::take(&mut *self.conns.lock());
        for s in &socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        socks.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}
