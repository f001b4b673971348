//! Operability and local access control (issue 19): the Unix socket's
//! peer-credential allowlist (`--allow-uid`, `--allow-gid`), and logs as
//! JSON lines (`--log-format json`).

use crate::common::{Server, run};

const MIB: u64 = 1 << 20;

/// This process's user and primary group (the tests run as root).
fn me() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// With an allowlist, only the listed users or groups get in: another is
/// refused (NBD_REP_ERR_POLICY with the reason, which the log shows too);
/// listed by uid or by gid,
/// it gets in. Negative control: the same client, refused under
/// `--allow-uid` of someone else, gets in without the flag (the first case).
#[test]
fn the_unix_socket_admits_only_the_listed_users_and_groups() {
    let (uid, gid) = me();
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    let other = (uid + 4242).to_string();
    let cases: [(Vec<String>, bool); 5] = [
        (vec![], true),
        (vec!["--allow-uid".into(), other.clone()], false),
        (vec!["--allow-gid".into(), other.clone()], false),
        (vec!["--allow-uid".into(), other.clone(), "--allow-uid".into(), uid.to_string()], true),
        (vec!["--allow-gid".into(), gid.to_string()], true),
    ];
    for (args, admitted) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        srv.spawn(&args);
        let out = run("nbdinfo", &[&srv.uri("disk")]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), admitted, "{args:?}: {said}\n{}", srv.log());
        if !admitted {
            // Refused by policy (NBD_REP_ERR_POLICY, which libnbd reports
            // as "not supported"), the reason in the server's log.
            assert!(said.contains("not supported"), "{args:?}: {said}");
            let log = srv.log();
            assert!(log.contains("may not connect") && log.contains("refusing"), "{log}");
        }
        srv.stop();
    }
}

/// `--log-format json`: every line the server logs is one JSON object
/// with a timestamp, a level and the message.
#[test]
fn logs_are_json_lines_when_asked() {
    let mut srv = Server::create(&[("disk", 64 * MIB)]);
    srv.spawn(&["--log-format", "json"]);
    let out = run("nbdinfo", &[&srv.uri("disk")]);
    assert!(out.status.success());
    srv.stop();
    let log = srv.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 3, "{log}");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
        assert!(v["fields"]["message"].is_string(), "{l}");
    }
    assert!(log.contains("\"listening (unix)\""), "{log}");
}
