//! Model-based tests of the Merkle map against `BTreeMap`.

use super::diff::Change;
use super::*;
use crate::error::Error;
use parking_lot::Mutex;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::collections::{BTreeMap, HashMap};

/// Nodes in memory, counting reads so tests can check costs.
#[derive(Default)]
pub struct MemNodes {
    nodes: Mutex<HashMap<ChunkId, Bytes>>,
    pub reads: std::sync::atomic::AtomicUsize,
}

impl NodeStore for MemNodes {
    fn get_node(&self, id: &ChunkId) -> Result<Bytes> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.nodes.lock().get(id).cloned().ok_or_else(|| Error::not_found("node"))
    }
    fn put_node(&self, data: &[u8]) -> Result<ChunkId> {
        let id = ChunkId::of(data);
        self.nodes.lock().insert(id, Bytes::copy_from_slice(data));
        Ok(id)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(u64, u8),
    Delete(u64),
    Batch(Vec<(u64, Option<u8>)>),
}

/// Keys drawn to exercise leaves, compressed paths and whole-range spreads.
fn key() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..64,
        2 => 0u64..600,
        1 => (0u64..4, 0u64..300).prop_map(|(hi, lo)| (hi << 40) | lo),
        1 => any::<u64>(),
        1 => Just(u64::MAX),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => key().prop_map(Op::Delete),
        1 => prop::collection::vec((key(), prop::option::of(any::<u8>())), 0..40).prop_map(Op::Batch),
    ]
}

fn val(v: u8) -> Bytes {
    Bytes::from(vec![v; (v % 7) as usize + 1])
}

fn apply_op(
    map: &Map<MemNodes>,
    root: MapRoot,
    model: &mut BTreeMap<u64, Bytes>,
    op: &Op,
) -> MapRoot {
    match op {
        Op::Put(k, v) => {
            model.insert(*k, val(*v));
            map.put(root, *k, val(*v)).unwrap()
        }
        Op::Delete(k) => {
            model.remove(k);
            map.delete(root, *k).unwrap()
        }
        Op::Batch(ups) => {
            let mut sorted: BTreeMap<u64, Option<Bytes>> = BTreeMap::new();
            for (k, v) in ups {
                sorted.insert(*k, v.map(val));
            }
            for (k, v) in &sorted {
                match v {
                    Some(v) => model.insert(*k, v.clone()),
                    None => model.remove(k),
                };
            }
            let ups: Vec<Update> = sorted.into_iter().collect();
            map.apply(root, &ups).unwrap()
        }
    }
}

fn model_diff(a: &BTreeMap<u64, Bytes>, b: &BTreeMap<u64, Bytes>) -> Vec<Change> {
    let keys: std::collections::BTreeSet<u64> = a.keys().chain(b.keys()).copied().collect();
    keys.into_iter()
        .filter(|k| a.get(k) != b.get(k))
        .map(|k| Change { key: k, old: a.get(&k).cloned(), new: b.get(&k).cloned() })
        .collect()
}

fn build_from(map: &Map<MemNodes>, model: &BTreeMap<u64, Bytes>) -> MapRoot {
    let ups: Vec<Update> = model.iter().map(|(k, v)| (*k, Some(v.clone()))).collect();
    map.apply(None, &ups).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        // Regressions live next to this file (src/map/tests.proptest-regressions).
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn behaves_like_a_btreemap(ops in prop::collection::vec(op(), 1..60), probes in prop::collection::vec(key(), 10)) {
        let nodes = MemNodes::default();
        let map = Map::new(&nodes);
        let mut model = BTreeMap::new();
        let mut root = None;
        for op in &ops {
            root = apply_op(&map, root, &mut model, op);
        }
        let got: Vec<(u64, Bytes)> = map.entries(root).unwrap();
        let want: Vec<(u64, Bytes)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
        prop_assert_eq!(got, want);
        for k in probes.iter().chain(model.keys()) {
            prop_assert_eq!(map.get(root, *k).unwrap(), model.get(k).cloned());
        }
        // Canonical: the same content built in one batch has the same root.
        prop_assert_eq!(root, build_from(&map, &model));
        prop_assert_eq!(root.is_none(), model.is_empty());
    }

    #[test]
    fn diff_matches_the_models_diff(
        base_ops in prop::collection::vec(op(), 0..40),
        a_ops in prop::collection::vec(op(), 0..20),
        b_ops in prop::collection::vec(op(), 0..20),
    ) {
        let nodes = MemNodes::default();
        let map = Map::new(&nodes);
        let mut base = BTreeMap::new();
        let mut root = None;
        for op in &base_ops {
            root = apply_op(&map, root, &mut base, op);
        }
        let (mut ma, mut mb) = (base.clone(), base.clone());
        let (mut ra, mut rb) = (root, root);
        for op in &a_ops {
            ra = apply_op(&map, ra, &mut ma, op);
        }
        for op in &b_ops {
            rb = apply_op(&map, rb, &mut mb, op);
        }
        prop_assert_eq!(map.diff(ra, rb).unwrap(), model_diff(&ma, &mb));
        prop_assert_eq!(map.diff(rb, ra).unwrap(), model_diff(&mb, &ma));
        prop_assert!(map.diff(ra, ra).unwrap().is_empty());
    }

    #[test]
    fn range_scan_matches_the_model(ops in prop::collection::vec(op(), 1..40), lo in key(), len in 0u64..1000) {
        let nodes = MemNodes::default();
        let map = Map::new(&nodes);
        let mut model = BTreeMap::new();
        let mut root = None;
        for op in &ops {
            root = apply_op(&map, root, &mut model, op);
        }
        let hi = lo.saturating_add(len);
        let mut got = Vec::new();
        map.range(root, lo, hi, &mut |k, v| { got.push((k, v.clone())); true }).unwrap();
        let want: Vec<(u64, Bytes)> = model.range(lo..=hi).map(|(k, v)| (*k, v.clone())).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn diff_of_a_small_change_in_a_large_map_reads_few_nodes() {
    let nodes = MemNodes::default();
    let map = Map::new(&nodes);
    let ups: Vec<Update> = (0..1_000_000u64).map(|k| (k, Some(val(k as u8)))).collect();
    let a = map.apply(None, &ups).unwrap();
    let b = map.put(a, 123_456, Bytes::from_static(b"changed")).unwrap();
    nodes.reads.store(0, std::sync::atomic::Ordering::Relaxed);
    let d = map.diff(a, b).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].key, 123_456);
    let reads = nodes.reads.load(std::sync::atomic::Ordering::Relaxed);
    // One path in each tree: 3 levels (leaf + 2 inner) for 2^20 keys.
    assert!(reads <= 8, "diff read {reads} nodes for one change");
}

#[test]
fn update_order_does_not_change_the_root() {
    let nodes = MemNodes::default();
    let map = Map::new(&nodes);
    let keys = [5u64, 1 << 40, 7, u64::MAX, 300, 1 << 63];
    let mut fwd = None;
    for k in keys {
        fwd = map.put(fwd, k, Bytes::from_static(b"v")).unwrap();
    }
    let mut rev = None;
    for k in keys.iter().rev() {
        rev = map.put(rev, *k, Bytes::from_static(b"v")).unwrap();
    }
    assert_eq!(fwd, rev);
    for k in keys {
        fwd = map.delete(fwd, k).unwrap();
    }
    assert_eq!(fwd, None);
}
