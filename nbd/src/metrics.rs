//! `--metrics ADDR`: a Prometheus text-format endpoint (`GET /metrics`)
//! on a TCP listener of its own: per-export requests, bytes, errors and
//! request latency histograms, connections, safe points and rollbacks in
//! btrfs mode, and the store's upload queue and disk cache. A tiny HTTP
//! server: one request per connection, headers bounded in size and time.

use crate::admit::Admission;
use crate::exports::Exports;
use crate::proto::Command;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// The largest request head read, and how long a scrape may take to send it.
const MAX_HEAD: usize = 8 << 10;
const HEAD_TIME: Duration = Duration::from_secs(5);
/// Scrapes served at once (a scraper takes one; Prometheus, a few).
pub const MAX_SCRAPES: usize = 8;

/// Request latencies of one kind.
#[derive(Default)]
struct Histogram {
    /// Requests at most each bound (not cumulative; summed when shown).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        // Read after the buckets: a request observed meanwhile must not
        // leave +Inf (which is the count) below the last bucket.
        let count = self.count.load(Ordering::Relaxed).max(cumulative);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// The latencies of one export's requests, by kind.
#[derive(Default)]
pub struct Latency {
    read: Histogram,
    write: Histogram,
    flush: Histogram,
    other: Histogram,
}

impl Latency {
    pub fn observe(&self, command: Command, d: Duration) {
        match command {
            Command::Read => &self.read,
            Command::Write => &self.write,
            Command::Flush => &self.flush,
            _ => &self.other,
        }
        .observe(d);
    }
}

/// One of an export's counters.
type Counter = fn(&crate::export::Counters) -> &AtomicU64;

/// What the endpoint shows.
pub struct Sources {
    pub exports: Arc<Exports>,
    pub admission: Arc<Admission>,
}

/// The metrics now, in Prometheus' text format.
pub fn render(src: &Sources) -> String {
    let mut out = String::new();
    gauge(&mut out, "forkfs_nbd_connections", "Connections open now.", src.admission.in_use());
    let exports = src.exports.opened();
    let counters: [(&str, &str, Counter); 8] = [
        ("reads", "READ requests.", |c| &c.reads),
        ("writes", "WRITE requests.", |c| &c.writes),
        ("read_bytes", "Bytes read.", |c| &c.bytes_read),
        ("written_bytes", "Bytes written.", |c| &c.bytes_written),
        ("flushes", "FLUSH requests.", |c| &c.flushes),
        ("zeroes", "WRITE_ZEROES and TRIM requests.", |c| &c.zeroes),
        ("errors", "Requests answered with an error.", |c| &c.errors),
        ("checkpoints", "Versions taken of the export.", |c| &c.checkpoints),
    ];
    for (name, help, get) in counters {
        family(&mut out, &format!("forkfs_nbd_{name}_total"), help, "counter");
        for e in &exports {
            let v = get(&e.counters).load(Ordering::Relaxed);
            let _ = writeln!(out, "forkfs_nbd_{name}_total{{export=\"{}\"}} {v}", label(&e.name));
        }
    }
    let name = "forkfs_nbd_request_duration_seconds";
    family(&mut out, name, "Time from a request's arrival to its reply, by kind.", "histogram");
    for e in &exports {
        let l = &e.latency;
        for (op, h) in
            [("read", &l.read), ("write", &l.write), ("flush", &l.flush), ("other", &l.other)]
        {
            h.render(&mut out, name, &format!("export=\"{}\",op=\"{op}\"", label(&e.name)));
        }
    }
    let btrfs: Vec<_> =
        exports.iter().filter_map(|e| Some((label(&e.name), e.safe_points()?))).collect();
    family(
        &mut out,
        "forkfs_nbd_safe_points_total",
        "btrfs mode: safe points persisted.",
        "counter",
    );
    for (name, (points, _)) in &btrfs {
        let _ = writeln!(out, "forkfs_nbd_safe_points_total{{export=\"{name}\"}} {points}");
    }
    let help = "btrfs mode: rollbacks to the last safe point.";
    family(&mut out, "forkfs_nbd_rollbacks_total", help, "counter");
    for (name, (_, rollbacks)) in &btrfs {
        let _ = writeln!(out, "forkfs_nbd_rollbacks_total{{export=\"{name}\"}} {rollbacks}");
    }
    let store = src.exports.store();
    if let Some(q) = store.upload_queue() {
        let out = &mut out;
        gauge(out, "forkfs_upload_pending_bytes", "Bytes waiting for upload.", q.pending_bytes);
        gauge(
            out,
            "forkfs_upload_pending_objects",
            "Objects waiting for upload.",
            q.pending_objects,
        );
        let oldest = q.oldest_ms as f64 / 1000.0;
        gauge(out, "forkfs_upload_oldest_seconds", "Age of the oldest waiting object.", oldest);
    }
    if let Some(c) = store.disk_cache_stats() {
        gauge(&mut out, "forkfs_disk_cache_bytes", "Bytes in the chunk cache.", c.bytes);
        gauge(&mut out, "forkfs_disk_cache_limit_bytes", "The chunk cache's limit.", c.limit);
    }
    out
}

/// The HELP and TYPE lines of a metric family.
fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A gauge without labels: its family lines and its one sample.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

/// A label value, escaped as the text format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, src: Arc<Sources>) {
    // Scrapes at once: more wait in the kernel's backlog, unaccepted, so a
    // flood of idle connections holds neither memory nor descriptors the
    // NBD listeners need.
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let Ok((mut s, _)) = listener.accept().await else {
            // Out of descriptors, say: try again later, without spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let src = src.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let head = tokio::time::timeout(HEAD_TIME, read_head(&mut s)).await;
            let reply = match head {
                Ok(Ok(h)) if h.starts_with("GET /metrics ") || h.starts_with("GET /metrics?") => {
                    let body = render(&src);
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                }
                Ok(Ok(_)) => {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                }
                _ => return,
            };
            // A scraper that does not read gives up its descriptor.
            let _ = tokio::time::timeout(HEAD_TIME, async {
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            })
            .await;
        });
    }
}

/// The request head (up to the blank line), at most [`MAX_HEAD`] bytes.
async fn read_head(s: &mut tokio::net::TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 || buf.len() + n > MAX_HEAD {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
