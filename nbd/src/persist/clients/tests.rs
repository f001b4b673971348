use super::*;

fn pid(n: i32) -> Peer {
    Peer::Process(n)
}

/// A finished request.
fn io(c: &mut Clients, who: &Client, write: bool, first: u64, end: u64) {
    let k = c.begin(who.id, write, first, end, (end - first) * 10);
    c.done(k);
}

#[test]
fn a_lost_client_takes_only_its_own_blocks() {
    let mut c = Clients::default();
    let (a, b) = (c.attach(pid(1)), c.attach(pid(2)));
    io(&mut c, &a, true, 0, 2);
    io(&mut c, &a, true, 2, 3);
    io(&mut c, &b, true, 10, 12);
    io(&mut c, &b, false, 20, 30);
    let f = c.fall(&a);
    assert_eq!(f.blocks, vec![(0, 3)]);
    assert_eq!(f.bytes, 30);
    assert_eq!(f.clients, vec![pid(1)]);
    assert!(f.others_wrote);
    assert!(a.failed() && !b.failed());
    // B falls later on its own blocks only.
    let f = c.fall(&b);
    assert_eq!((f.blocks, f.others_wrote), (vec![(10, 12)], false));
}

#[test]
fn shared_blocks_entangle_writers_either_way() {
    for a_first in [true, false] {
        let mut c = Clients::default();
        let (a, b, r) = (c.attach(pid(1)), c.attach(pid(2)), c.attach(pid(3)));
        let (x, y) = if a_first { (&a, &b) } else { (&b, &a) };
        io(&mut c, x, true, 0, 4);
        io(&mut c, y, true, 3, 8);
        io(&mut c, &r, true, 100, 101);
        let f = c.fall(&b);
        assert_eq!(f.blocks, vec![(0, 8)], "a_first {a_first}");
        assert!(a.failed() && b.failed() && !r.failed());
        assert!(f.others_wrote);
    }
}

#[test]
fn a_reader_of_lost_writes_falls_but_a_lost_reader_takes_nobody() {
    let mut c = Clients::default();
    let (w, r) = (c.attach(pid(1)), c.attach(pid(2)));
    // Read before the write: the reader's data is not discarded.
    io(&mut c, &r, false, 5, 6);
    io(&mut c, &w, true, 0, 6);
    let lost_reader = c.fall(&r);
    assert_eq!(lost_reader, Fall::default(), "a reader has nothing to discard");
    assert!(!w.failed() && !r.failed());
    io(&mut c, &r, true, 50, 51);
    io(&mut c, &r, false, 5, 6);
    let f = c.fall(&w);
    assert_eq!(f.blocks, vec![(0, 6), (50, 51)]);
    assert!(w.failed() && r.failed());
    assert!(!f.others_wrote);
}

#[test]
fn a_seal_forgets_finished_requests_and_keeps_those_in_flight() {
    let mut c = Clients::default();
    let (a, b) = (c.attach(pid(1)), c.attach(pid(2)));
    io(&mut c, &a, true, 0, 1);
    let running = c.begin(a.id, true, 7, 9, 5);
    c.sealing();
    // B's write to block 0 is not entangled with A's sealed one.
    io(&mut c, &b, true, 0, 1);
    c.done(running);
    let f = c.fall(&a);
    assert_eq!((f.blocks, f.bytes), (vec![(7, 9)], 5));
    assert!(!b.failed());
}

#[test]
fn connections_of_one_peer_are_one_client_until_the_last_ends() {
    let mut c = Clients::default();
    let (a1, a2) = (c.attach(pid(1)), c.attach(pid(1)));
    assert_eq!(a1.id, a2.id);
    io(&mut c, &a2, true, 0, 1);
    // Losing one connection fails the other (multi-conn).
    c.detach(&a1);
    c.fall(&a1);
    assert!(a2.failed());
    // The peer's next connection is a new client, not failed.
    let a3 = c.attach(pid(1));
    assert!(a3.id != a1.id && !a3.failed());
    c.detach(&a2);
    c.detach(&a3);
    // A client that left cleanly keeps its writes; a new one from the same
    // pid does not inherit them.
    let a4 = c.attach(pid(1));
    io(&mut c, &a4, true, 3, 4);
    c.detach(&a4);
    let a5 = c.attach(pid(1));
    assert_ne!(a4.id, a5.id);
    assert_eq!(c.fall(&a5), Fall::default());
}

#[test]
fn everyone_falls_when_the_server_stops() {
    let mut c = Clients::default();
    let (a, b) = (c.attach(pid(1)), c.attach(Peer::Host("10.0.0.1".parse().unwrap())));
    c.fall_all();
    assert!(a.failed() && b.failed());
    assert!(!c.attach(pid(1)).failed());
}
