//! Who wrote what since the last safe point, so that a client whose
//! connection drops loses only its own writes (btrfs consistency mode).
//!
//! **A client** is what NBD does not name: here, the connections to one
//! export that share a peer identity ([`Peer`]) while at least one of them
//! is attached. Over a Unix socket the identity is the peer's process id
//! (SO_PEERCRED): nbdfuse, qemu or nbdcopy with all their connections is one
//! client. Over TCP it is the peer's IP address: every process of one host
//! (and every host behind one NAT or proxy) is one client. Putting two
//! clients in one only widens a rollback back towards the whole export (the
//! behaviour before clients existed); splitting one client in two (one
//! filesystem written through two processes on a Unix socket) would keep
//! half of a lost transaction, so give such a client one process, or serve
//! it over TCP, or serve with `--client-by export` (every connection of an
//! export one client: any lost connection rolls back everything since the
//! last safe point and fails every connection). When the last connection of a client ends, the client ends:
//! the next connection from that peer is a new client (pid reuse cannot
//! join them), and what the old one wrote stands unless it is entangled
//! with a client that is later lost.
//!
//! **Entanglement.** Since the last seal, a client *depends on* another when
//! it wrote a block the other also wrote (either order: the pending layer
//! keeps one entry per block, so one's writes cannot be dropped without
//! the other's), or read a block the other had written (its cache holds
//! data about to be discarded). When a client's connection is lost, the
//! client and everything that depends on it, transitively, *fall*: their
//! writes since the seal are discarded (the union of their written blocks,
//! which no standing client wrote), and every connection they have is
//! failed from then on. A lost client that wrote nothing discards nothing
//! and fails nobody.
//!
//! **Exactness.** Requests are noted before they touch the head and stay
//! *in flight* until they finish. A seal forgets every finished request
//! (what it wrote is sealed) but keeps those in flight, which may land on
//! either side of it; so the record may hold blocks that were sealed (a
//! wider rollback, never a narrower one) but never misses a pending block.
//! A rollback runs with no request in flight (see `Persistence::detach`).
//! Requests are noted only while the volume defers persistence: a write
//! admitted just before the operator switches a served volume to btrfs
//! mode can land in the pending layer unnoted, and then stands when its
//! client is lost (unless no other client wrote: then the whole layer
//! goes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A connection's peer identity: connections with equal peers are one client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A Unix socket peer's process id (SO_PEERCRED).
    Process(i32),
    /// A Unix socket peer whose credentials could not be read: all such
    /// connections are one client.
    UnknownProcess,
    /// A TCP peer's IP address (not the port).
    Host(IpAddr),
    /// Any peer (`--client-by export`): every connection of an export is
    /// one client, and any lost connection rolls back every write since
    /// the last safe point.
    Anyone,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Process(pid) => write!(f, "pid {pid}"),
            Peer::UnknownProcess => f.write_str("unix peer without credentials"),
            Peer::Host(ip) => write!(f, "{ip}"),
            Peer::Anyone => f.write_str("any peer"),
        }
    }
}

/// One attached connection's view of its client.
#[derive(Clone, Debug)]
pub struct Client {
    pub id: u64,
    pub peer: Peer,
    failed: Arc<AtomicBool>,
}

impl Client {
    /// Whether the client fell in a rollback: its connections are refused.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

/// What a lost client takes down with it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fall {
    /// The clients that fell (the lost one first), by peer.
    pub clients: Vec<Peer>,
    /// Their written blocks since the seal: disjoint `[first, end)`, in order.
    pub blocks: Vec<(u64, u64)>,
    /// Bytes they wrote, zeroed or trimmed since the seal.
    pub bytes: u64,
    /// Whether any standing client still has writes since the seal.
    pub others_wrote: bool,
}

struct Entry {
    peer: Peer,
    connections: u32,
    failed: Arc<AtomicBool>,
    /// Blocks written since the seal: start -> end, disjoint, not touching.
    written: BTreeMap<u64, u64>,
    bytes: u64,
    /// Clients that fall when this one does.
    dependents: HashSet<u64>,
}

impl Entry {
    fn wrote_in(&self, first: u64, end: u64) -> bool {
        self.written.range(..end).next_back().is_some_and(|(_, e)| *e > first)
    }
}

#[derive(Clone, Copy)]
struct Io {
    client: u64,
    write: bool,
    first: u64,
    end: u64,
    bytes: u64,
}

/// The clients of one export and what they did since the last seal.
#[derive(Default)]
pub struct Clients {
    next_id: u64,
    /// The current client of each peer, while it has connections.
    by_peer: HashMap<Peer, u64>,
    entries: HashMap<u64, Entry>,
    next_io: u64,
    in_flight: BTreeMap<u64, Io>,
}

impl Clients {
    /// A connection from `peer` attaches: it joins the peer's current
    /// client, or starts one.
    pub fn attach(&mut self, peer: Peer) -> Client {
        if let Some(id) = self.by_peer.get(&peer)
            && let Some(e) = self.entries.get_mut(id)
        {
            e.connections += 1;
            return Client { id: *id, peer, failed: e.failed.clone() };
        }
        self.next_id += 1;
        let id = self.next_id;
        let failed = Arc::new(AtomicBool::new(false));
        self.by_peer.insert(peer.clone(), id);
        self.entries.insert(
            id,
            Entry {
                peer: peer.clone(),
                connections: 1,
                failed: failed.clone(),
                written: BTreeMap::new(),
                bytes: 0,
                dependents: HashSet::new(),
            },
        );
        Client { id, peer, failed }
    }

    /// A connection of `client` ended. The client ends with its last one;
    /// its record stays while it holds writes.
    pub fn detach(&mut self, client: &Client) {
        let Some(e) = self.entries.get_mut(&client.id) else { return };
        e.connections = e.connections.saturating_sub(1);
        if e.connections > 0 {
            return;
        }
        if self.by_peer.get(&e.peer) == Some(&client.id) {
            self.by_peer.remove(&e.peer);
        }
        if e.written.is_empty() {
            self.entries.remove(&client.id);
        }
    }

    /// Notes a request of `client` on blocks `[first, end)` before it runs;
    /// returns its key for [`Clients::done`].
    pub fn begin(&mut self, client: u64, write: bool, first: u64, end: u64, bytes: u64) -> u64 {
        let io = Io { client, write, first, end, bytes };
        self.apply(io);
        self.next_io += 1;
        self.in_flight.insert(self.next_io, io);
        self.next_io
    }

    /// A request noted by [`Clients::begin`] finished.
    pub fn done(&mut self, key: u64) {
        self.in_flight.remove(&key);
    }

    fn apply(&mut self, io: Io) {
        if io.end <= io.first || !self.entries.contains_key(&io.client) {
            return;
        }
        let others: Vec<u64> = self
            .entries
            .iter()
            .filter(|(id, e)| **id != io.client && e.wrote_in(io.first, io.end))
            .map(|(id, _)| *id)
            .collect();
        for o in &others {
            if let Some(e) = self.entries.get_mut(o) {
                e.dependents.insert(io.client);
            }
        }
        let me = self.entries.get_mut(&io.client).expect("checked above");
        if io.write {
            me.dependents.extend(others);
            forkfs::merge_range(&mut me.written, io.first, io.end);
            me.bytes += io.bytes;
        }
    }

    /// A seal is about to make every pending write part of the head: the
    /// finished requests are forgotten, the ones in flight noted again.
    pub fn sealing(&mut self) {
        for e in self.entries.values_mut() {
            e.written.clear();
            e.bytes = 0;
            e.dependents.clear();
        }
        self.entries.retain(|_, e| e.connections > 0);
        let ios: Vec<Io> = self.in_flight.values().copied().collect();
        for io in ios {
            self.apply(io);
        }
    }

    /// A connection of `client` was lost: the client and its dependents
    /// fall (see the module doc). Call with no request in flight. A fall
    /// that discards nothing fails nobody.
    pub fn fall(&mut self, client: &Client) -> Fall {
        let mut order = vec![client.id];
        let mut seen: HashSet<u64> = order.iter().copied().collect();
        let mut i = 0;
        while i < order.len() {
            if let Some(e) = self.entries.get(&order[i]) {
                for d in &e.dependents {
                    if seen.insert(*d) {
                        order.push(*d);
                    }
                }
            }
            i += 1;
        }
        let mut fall = Fall::default();
        let mut blocks = BTreeMap::new();
        for id in &order {
            if let Some(e) = self.entries.get(id) {
                for (a, b) in &e.written {
                    forkfs::merge_range(&mut blocks, *a, *b);
                }
                fall.bytes += e.bytes;
            }
        }
        if blocks.is_empty() {
            return fall;
        }
        for id in &order {
            let Some(e) = self.entries.get_mut(id) else { continue };
            e.failed.store(true, Ordering::SeqCst);
            e.written.clear();
            e.bytes = 0;
            e.dependents.clear();
            fall.clients.push(e.peer.clone());
            // New connections from the peer start a new client.
            if self.by_peer.get(&e.peer) == Some(id) {
                self.by_peer.remove(&e.peer);
            }
        }
        for e in self.entries.values_mut() {
            e.dependents.retain(|d| !seen.contains(d));
        }
        self.entries.retain(|_, e| e.connections > 0 || !e.written.is_empty());
        fall.others_wrote = self.entries.values().any(|e| !e.written.is_empty());
        fall.blocks = blocks.into_iter().collect();
        fall
    }

    /// The server stops (or the whole head was rolled back): every client
    /// falls.
    pub fn fall_all(&mut self) {
        for e in self.entries.values_mut() {
            e.failed.store(true, Ordering::SeqCst);
            e.written.clear();
            e.bytes = 0;
            e.dependents.clear();
        }
        self.by_peer.clear();
        self.entries.retain(|_, e| e.connections > 0);
    }
}

#[cfg(test)]
mod tests;
