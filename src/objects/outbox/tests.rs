//! The outbox against object_store's in-memory store behind a decorator
//! that fails puts on demand (an unreachable object store).

use super::*;
use object_store::memory::InMemory;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, PutMultipartOptions, PutOptions, PutResult,
};
use std::sync::atomic::{AtomicBool, Ordering};

/// Fails every put while `down`; everything else passes through. Keeps
/// the keys it stored, in order.
#[derive(Debug)]
struct Flaky {
    inner: InMemory,
    down: AtomicBool,
    stored: parking_lot::Mutex<Vec<Path>>,
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.down.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "flaky",
                source: "the object store is down".into(),
            });
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        self.stored.lock().push(location.clone());
        Ok(r)
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.inner.delete(location).await
    }
    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    path: PathBuf,
    flaky: Arc<Flaky>,
    rt: tokio::runtime::Runtime,
}

impl Rig {
    fn new(down: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox");
        let flaky = Arc::new(Flaky {
            inner: InMemory::new(),
            down: AtomicBool::new(down),
            stored: parking_lot::Mutex::new(Vec::new()),
        });
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        Rig { _dir: dir, path, flaky, rt }
    }

    fn open(&self, limit: u64) -> Outbox {
        Outbox::open(self.path.clone(), self.flaky.clone(), self.rt.handle().clone(), limit)
            .unwrap()
    }

    fn remote(&self, key: &Path) -> Option<Bytes> {
        let (s, k) = (self.flaky.clone(), key.clone());
        self.rt.block_on(async move { Some(s.get(&k).await.ok()?.bytes().await.unwrap()) })
    }

    fn files(&self) -> usize {
        std::fs::read_dir(&self.path).unwrap().count()
    }
}

fn pack(n: u8) -> Path {
    keys::pack(&crate::id::PackId([n; 16]))
}

#[test]
fn queued_objects_read_like_stored_ones_and_upload_once_the_store_is_back() {
    let rig = Rig::new(true);
    let o = rig.open(1 << 30);
    let data = Bytes::from_static(b"0123456789");
    o.put(&pack(1), &data).unwrap();
    assert_eq!(o.read(&pack(1)).unwrap(), Some(data.clone()));
    assert_eq!(o.read_range(&pack(1), 2..5).unwrap(), Some(Bytes::from_static(b"234")));
    assert!(o.read_range(&pack(1), 5..11).is_err(), "a range past the end is an error");
    assert_eq!(o.len_of(&pack(1)), Some(10));
    assert_eq!(o.list("packs/").len(), 1);
    assert!(o.list("versions/").is_empty());
    let err = o.drain(Duration::from_millis(600)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.to_string().contains("1 objects (10 bytes)"), "{err}");
    let t0 = Instant::now();
    while o.stats().last_error.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no upload attempt failed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = o.stats();
    assert_eq!((st.pending_objects, st.pending_bytes), (1, 10));
    assert!(st.last_error.as_deref().unwrap_or("").contains("down"), "{st:?}");
    assert_eq!(rig.remote(&pack(1)), None);

    rig.flaky.down.store(false, Ordering::SeqCst);
    o.drain(Duration::from_secs(30)).unwrap();
    assert_eq!(rig.remote(&pack(1)), Some(data));
    assert_eq!(o.stats().pending_bytes, 0);
    assert_eq!(o.stats().last_error, None);
    assert_eq!(o.read(&pack(1)).unwrap(), None, "served by the object store now");
    assert_eq!(rig.files(), 0, "the local copy is gone once uploaded");
}

#[test]
fn a_record_never_reaches_the_store_before_the_packs_queued_earlier() {
    let rec = Path::from("versions/v.json");
    let mut st = State::default();
    for (seq, key) in [(0, pack(1)), (1, rec.clone()), (2, pack(2))] {
        let e = Entry {
            key,
            len: 1,
            file: PathBuf::new(),
            ready: true,
            uploading: false,
            not_before: None,
            queued: Instant::now(),
        };
        st.entries.insert(seq, e);
    }
    // The next job: the first pack, or the later one (packs go in any
    // order), never the record while anything is before it.
    let picks = |st: &State| next_job(st).ok().flatten().map(|j| j.1);
    assert_eq!(picks(&st), Some(pack(1)));
    st.entries.get_mut(&0).unwrap().uploading = true;
    assert_eq!(picks(&st), Some(pack(2)), "a pack after the record may go meanwhile");
    st.entries.get_mut(&2).unwrap().uploading = true;
    assert_eq!(picks(&st), None, "the record waits for the pack before it");
    st.entries.get_mut(&0).unwrap().not_before = Some(Instant::now() + MAX_BACKOFF);
    st.entries.get_mut(&0).unwrap().uploading = false;
    assert!(next_job(&st).is_err(), "a pack backing off: wake up when it may retry");
    st.entries.remove(&0);
    assert_eq!(picks(&st), Some(rec.clone()), "once nothing is before it, the record");

    // And end to end: the record reaches the store only after the packs.
    let rig = Rig::new(true);
    let o = rig.open(1 << 30);
    for n in 1..=6 {
        o.put(&pack(n), &Bytes::from(vec![n; 1 << 16])).unwrap();
    }
    o.put(&rec, &Bytes::from_static(b"record")).unwrap();
    rig.flaky.down.store(false, Ordering::SeqCst);
    o.drain(Duration::from_secs(30)).unwrap();
    assert_eq!(rig.remote(&rec), Some(Bytes::from_static(b"record")));
    let stored = rig.flaky.stored.lock().clone();
    assert_eq!(stored.len(), 7, "{stored:?}");
    assert_eq!(stored.last(), Some(&rec), "the record went before a pack: {stored:?}");
}

#[test]
fn a_new_process_resumes_what_a_dead_one_left_queued() {
    let rig = Rig::new(true);
    let o = rig.open(1 << 30);
    o.put(&pack(7), &Bytes::from_static(b"survives")).unwrap();
    drop(o);
    // A put cut short before its rename leaves a temporary file.
    std::fs::write(rig.path.join(".tmp-00000000000000ff"), b"torn").unwrap();
    let o = rig.open(1 << 30);
    assert_eq!(o.stats().pending_objects, 1, "the torn put is not an object");
    rig.flaky.down.store(false, Ordering::SeqCst);
    o.drain(Duration::from_secs(30)).unwrap();
    assert_eq!(rig.remote(&pack(7)), Some(Bytes::from_static(b"survives")));
    assert_eq!(rig.files(), 0);
    assert_eq!(o.tail(), 1, "sequence numbers go on after the resumed ones");
}

#[test]
fn writers_wait_above_the_limit_until_uploads_catch_up() {
    let rig = Rig::new(true);
    let o = Arc::new(rig.open(100));
    o.put(&pack(1), &Bytes::from(vec![1u8; 80])).unwrap();
    o.wait_for_room(); // 80 of 100: room
    o.put(&pack(2), &Bytes::from(vec![2u8; 80])).unwrap(); // a put never waits
    let o2 = o.clone();
    let writer = std::thread::spawn(move || o2.wait_for_room());
    std::thread::sleep(Duration::from_millis(500));
    assert!(!writer.is_finished(), "160 bytes pending of 100: a writer must wait");
    assert_eq!(o.stats().pending_bytes, 160);
    rig.flaky.down.store(false, Ordering::SeqCst);
    writer.join().unwrap();
    o.drain(Duration::from_secs(30)).unwrap();
    assert_eq!(rig.remote(&pack(2)).map(|b| b.len()), Some(80));
}

#[test]
fn a_forgotten_object_never_uploads() {
    let rig = Rig::new(true);
    let o = rig.open(1 << 30);
    o.put(&pack(3), &Bytes::from_static(b"dropped")).unwrap();
    o.forget(&pack(3));
    assert_eq!(o.stats().pending_objects, 0);
    rig.flaky.down.store(false, Ordering::SeqCst);
    o.drain(Duration::from_secs(5)).unwrap();
    assert_eq!(rig.remote(&pack(3)), None);
    assert_eq!(rig.files(), 0);
}

#[test]
fn file_names_round_trip_and_strangers_are_refused() {
    let key = Path::from("versions/0a1b.json");
    assert_eq!(parse_name(&file_name(42, &key)), Some((42, key)));
    for bad in ["x", "12-packs%a", ".tmp-0000000000000001", "000000000000000g-a"] {
        assert_eq!(parse_name(bad), None, "{bad}");
    }
}
