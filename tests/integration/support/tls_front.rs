//! A private CA and an https endpoint it signed, in front of a plain-http test server (the
//! emulator, the token server): what a director behind Azure Stack or a TLS-inspecting proxy sees.

/// A CA and a server certificate for 127.0.0.1 signed by it (openssl, as an operator's private
/// CA would be made). Returns (CA PEM path, server cert PEM, server key PEM).
pub fn private_ca(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (the TLS test needs the openssl command)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=Private Test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (
        dir.join("ca.pem"),
        std::fs::read(dir.join("srv.pem")).unwrap(),
        std::fs::read(dir.join("srv.key")).unwrap(),
    )
}

/// An https endpoint on 127.0.0.1 terminating TLS with `cert`/`key` and forwarding the bytes to
/// `target` (the emulator's plain-http ARM address). Returns `https://127.0.0.1:PORT`.
pub async fn tls_front(target: &str, cert: &[u8], key: &[u8]) -> String {
    tls_front_counted(target, cert, key).await.0
}

/// [`tls_front`], and the number of connections it has accepted so far (each one a TLS
/// handshake a client began: a client that does not trust the CA aborts it, so the server
/// behind never sees that request, but this count does).
pub async fn tls_front_counted(
    target: &str,
    cert: &[u8],
    key: &[u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let target = url::Url::parse(target).unwrap();
    let upstream = format!(
        "{}:{}",
        target.host_str().unwrap(),
        target.port_or_known_default().unwrap()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                // A client that does not trust the CA aborts the handshake: nothing to forward.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                }
            });
        }
    });
    (format!("https://127.0.0.1:{port}"), accepted)
}
