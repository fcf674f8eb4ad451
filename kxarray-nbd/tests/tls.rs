//! TLS (`NBD_OPT_STARTTLS`): libnbd's tools (`nbdinfo`, `nbdcopy`) over
//! `nbds://` with certificates made here, client certificates with
//! `--tls-verify-peer`, and a raw client that skips STARTTLS against a
//! server that requires it (refused, nothing served). Without the
//! tools (`apt-get install -y libnbd-bin`) the libnbd tests report
//! themselves ignored, with the reason.

#[path = "../../tests/harness/mod.rs"]
mod harness;

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::Transport;
use common::{is_closed, open, read_option_reply, send_option, start_config, Client, Running};
use kxarray::backend::RamDisk;
use kxarray_nbd::proto::*;
use kxarray_nbd::tls::TlsError;
use kxarray_nbd::{Config, Export, ListenAddr, Tls, TlsMode};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

const SIZE: u64 = 8 << 20;

/// A CA, a server certificate for 127.0.0.1 and localhost, and a client
/// certificate, written as nbdkit's server directory and libnbd's client
/// directories (one with the client certificate, one without).
struct Certs {
    _dir: tempfile::TempDir,
    server: PathBuf,
    client: PathBuf,
    anonymous: PathBuf,
}

impl Certs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "kxarray-nbd test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();

        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, cn: &str| {
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![usage];
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            "localhost",
        );
        let (client_cert, client_key) =
            leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth, "test client");

        let mk = |name: &str, files: &[(&str, &str)]| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            for (f, text) in files {
                std::fs::write(d.join(f), text).unwrap();
            }
            d
        };
        let ca_pem = ca.pem();
        let server = mk(
            "server",
            &[
                ("ca-cert.pem", &ca_pem),
                ("server-cert.pem", &server_cert),
                ("server-key.pem", &server_key),
            ],
        );
        let client = mk(
            "client",
            &[
                ("ca-cert.pem", &ca_pem),
                ("client-cert.pem", &client_cert),
                ("client-key.pem", &client_key),
            ],
        );
        let anonymous = mk("anonymous", &[("ca-cert.pem", &ca_pem)]);
        Self {
            _dir: dir,
            server,
            client,
            anonymous,
        }
    }
}

fn start_tls(certs: &Certs, mode: TlsMode, verify_peer: bool) -> Running {
    let tls = Tls::from_dir(&certs.server, mode, verify_peer).unwrap();
    let export = Export::new("", Arc::new(RamDisk::new(SIZE))).unwrap();
    start_config(
        export,
        Config::new(1).tls(Some(Arc::new(tls))),
        Transport::Tcp,
    )
}

fn port(addr: &ListenAddr) -> u16 {
    match addr {
        ListenAddr::Tcp(a) => a.port(),
        ListenAddr::Unix(_) => unreachable!("TLS tests listen on TCP"),
    }
}

fn nbds(addr: &ListenAddr, client_dir: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{}/?tls-certificates={}",
        port(addr),
        client_dir.display()
    )
}

/// `nbdinfo` and `nbdcopy`, or the test skips.
fn need_tools() {
    harness::require(harness::tool("nbdinfo", "libnbd-bin"));
    harness::require(harness::tool("nbdcopy", "libnbd-bin"));
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd).args(args).output().expect(cmd)
}

fn nbdinfo_and_nbdcopy_over_nbds() {
    need_tools();
    let certs = Certs::new();
    let server = start_tls(&certs, TlsMode::Require, false);
    let uri = nbds(&server.addr, &certs.client);

    let info = run("nbdinfo", &[&uri]);
    let out = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.status.success(),
        "nbdinfo {uri}: {out}{}",
        String::from_utf8_lossy(&info.stderr)
    );
    assert!(out.contains(&SIZE.to_string()), "size not reported: {out}");
    assert!(out.contains("with TLS"), "nbdinfo did not use TLS: {out}");

    // A random image copied in, then the whole export copied out.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let dst = dir.path().join("dst.img");
    let data = common::random_bytes(3 << 20);
    std::fs::write(&src, &data).unwrap();
    for (from, to) in [
        (src.to_str().unwrap(), uri.as_str()),
        (uri.as_str(), dst.to_str().unwrap()),
    ] {
        let c = run("nbdcopy", &[from, to]);
        assert!(
            c.status.success(),
            "nbdcopy {from} {to}: {}",
            String::from_utf8_lossy(&c.stderr)
        );
    }
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len() as u64, SIZE);
    assert!(
        back[..data.len()] == data[..],
        "nbdcopy's round trip differs"
    );
    assert!(back[data.len()..].iter().all(|&b| b == 0));

    // Without TLS the required server serves nothing.
    let plain = format!("nbd://127.0.0.1:{}/", port(&server.addr));
    let c = run("nbdinfo", &[&plain]);
    assert!(!c.status.success(), "nbdinfo without TLS was served");
    server.stop();
}

fn verify_peer_requires_a_client_certificate_from_the_ca() {
    need_tools();
    let certs = Certs::new();
    let server = start_tls(&certs, TlsMode::Require, true);
    let ok = run("nbdinfo", &[&nbds(&server.addr, &certs.client)]);
    assert!(
        ok.status.success(),
        "with a client certificate: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let refused = run("nbdinfo", &[&nbds(&server.addr, &certs.anonymous)]);
    assert!(
        !refused.status.success(),
        "served a client without a certificate"
    );
    server.stop();
}

fn a_client_skipping_starttls_is_refused_everything_when_tls_is_required() {
    let certs = Certs::new();
    let server = start_tls(&certs, TlsMode::Require, false);
    let go = InfoRequest {
        name: vec![],
        requests: vec![NBD_INFO_BLOCK_SIZE],
    }
    .encode();
    let mut s = open(
        &server.addr,
        NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
    );
    for (opt, data) in [
        (NBD_OPT_LIST, &[][..]),
        (NBD_OPT_INFO, &go[..]),
        (NBD_OPT_GO, &go[..]),
        (NBD_OPT_STRUCTURED_REPLY, &[][..]),
        (NBD_OPT_SET_META_CONTEXT, &[][..]),
        (12345, &[][..]),
    ] {
        send_option(&mut s, opt, data);
        let (h, _) = read_option_reply(&mut s);
        assert_eq!(
            (h.option, h.reply_type),
            (opt, NBD_REP_ERR_TLS_REQD),
            "{}",
            option_name(opt)
        );
    }
    // Still in the handshake: a transmission request is a bad option.
    let r = Request {
        flags: 0,
        command: NBD_CMD_READ,
        cookie: 1,
        offset: 0,
        length: 4096,
    };
    s.write_all(&r.encode()).unwrap();
    assert!(is_closed(&mut s), "a READ before TLS was not refused");

    // NBD_OPT_EXPORT_NAME cannot be refused politely: closed, nothing sent.
    let mut s = open(
        &server.addr,
        NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
    );
    send_option(&mut s, NBD_OPT_EXPORT_NAME, b"");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "bytes after EXPORT_NAME without TLS: {rest:?}"
    );

    // ABORT is answered.
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, NBD_OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ACK);
    assert!(is_closed(&mut s));

    // STARTTLS with data is invalid; without, it is accepted.
    let mut s = open(&server.addr, NBD_FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, NBD_OPT_STARTTLS, b"x");
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ERR_INVALID);
    send_option(&mut s, NBD_OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).0.reply_type, NBD_REP_ACK);
    // Clear text where the TLS ClientHello belongs ends the connection.
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut alert = Vec::new();
    let _ = s.read_to_end(&mut alert);
    assert!(alert.len() <= 7, "more than a TLS alert: {alert:?}");
    server.stop();
}

fn tls_on_also_serves_clients_in_clear() {
    let certs = Certs::new();
    let server = start_tls(&certs, TlsMode::On, false);
    let mut c = Client::connect(&server.addr, true);
    c.write(0, b"clear").unwrap();
    assert_eq!(c.read(0, 5).unwrap(), b"clear");
    c.disconnect();
    server.stop();
}

fn bad_certificate_directories_are_named_errors() {
    let certs = Certs::new();
    let empty = tempfile::tempdir().unwrap();
    match Tls::from_dir(empty.path(), TlsMode::On, false) {
        Err(TlsError::File { path, .. }) => assert!(path.ends_with("server-cert.pem")),
        other => panic!("{other:?}"),
    }
    // With --tls-verify-peer the CA is needed.
    let no_ca = tempfile::tempdir().unwrap();
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(certs.server.join(f), no_ca.path().join(f)).unwrap();
    }
    assert!(Tls::from_dir(no_ca.path(), TlsMode::On, false).is_ok());
    match Tls::from_dir(no_ca.path(), TlsMode::On, true) {
        Err(TlsError::File { path, .. }) => assert!(path.ends_with("ca-cert.pem")),
        other => panic!("{other:?}"),
    }
    // A key that is not the certificate's.
    std::fs::write(
        no_ca.path().join("server-key.pem"),
        KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let e = Tls::from_dir(no_ca.path(), TlsMode::On, false).unwrap_err();
    assert!(matches!(e, TlsError::Rustls(_)), "{e}");
}

harness::main!(
    tests: [
        nbdinfo_and_nbdcopy_over_nbds,
        verify_peer_requires_a_client_certificate_from_the_ca,
        a_client_skipping_starttls_is_refused_everything_when_tls_is_required,
        tls_on_also_serves_clients_in_clear,
        bad_certificate_directories_are_named_errors,
    ],
);
