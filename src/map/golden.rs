//! Golden tests of the Merkle map node format (docs/FORMAT.md: Merkle map
//! node): a leaf and an inner node encoded by the real code, compared byte
//! for byte with `tests/golden/`, and decoded back. `FORKFS_BLESS=1`
//! rewrites the files (see `files::golden`).

use super::node::Node;
use crate::files::golden;
use crate::id::ChunkId;
use bytes::Bytes;

#[test]
fn golden_map_nodes() {
    let leaf = Node::Leaf {
        base: 0x0102_0304_0506_0700,
        entries: vec![(1, Bytes::from_static(b"one")), (0xfe, Bytes::from_static(b"two"))],
    };
    let want = golden("map-leaf.bin", &leaf.encode());
    assert_eq!(Node::decode(&Bytes::from(want)).expect("decodes"), leaf);
    let inner = Node::Inner {
        level: 2,
        base: 0x0a0b_0c0d_0e00_0000,
        children: vec![(3, ChunkId([0x11; 32])), (7, ChunkId([0x22; 32]))],
    };
    let want = golden("map-inner.bin", &inner.encode());
    assert_eq!(Node::decode(&Bytes::from(want)).expect("decodes"), inner);
}
