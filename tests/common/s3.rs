//! An S3 API on loopback for the remote-store tests: moto's server.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// moto's S3 server on a free loopback port; killed on drop.
pub struct S3 {
    child: Child,
    pub endpoint: String,
    pub port: u16,
}

impl S3 {
    pub fn start(bucket: &str) -> S3 {
        let found = Command::new("sh").arg("-c").arg("command -v moto_server").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "moto_server is not installed: run scripts/install-deps (pip install 'moto[server]')"
        );
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let endpoint = format!("http://127.0.0.1:{port}");
        let s3 = S3 { child, endpoint, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Creating the bucket is also the readiness probe.
        while !s3.create_bucket(bucket) {
            assert!(Instant::now() < deadline, "moto_server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        s3
    }

    fn create_bucket(&self, bucket: &str) -> bool {
        self.request("PUT", &format!("/{bucket}")).is_some()
    }

    /// The keys under `prefix` in `bucket` (up to 1,000: the tests' few).
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let body = self
            .request("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"))
            .unwrap_or_else(|| panic!("listing {bucket}/{prefix} on moto failed"));
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect()
    }

    /// One plain HTTP request (moto checks no signatures); the response
    /// when its status is 200.
    fn request(&self, method: &str, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let addr = self.endpoint.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut resp = String::new();
        s.write_all(req.as_bytes()).ok()?;
        s.read_to_string(&mut resp).ok()?;
        resp.starts_with("HTTP/1.1 200").then_some(resp)
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
