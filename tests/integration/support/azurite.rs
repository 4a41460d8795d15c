//! Start the pinned Azurite (blob service only, in memory) on a free loopback port for one test;
//! it is killed when the handle is dropped.
//!
//! Tools are found through `STEMCELL_GALLERY_TOOLS` (set by scripts/test.sh) or `<crate>/.tools`;
//! a missing Azurite fails the test with the command that installs it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Azurite {
    child: Child,
    pub port: u16,
    _workdir: tempfile::TempDir,
}

impl Azurite {
    /// The blob endpoint, path-style: `http://127.0.0.1:PORT/devstoreaccount1`.
    pub fn blob_endpoint(&self) -> url::Url {
        url::Url::parse(&format!("http://127.0.0.1:{}/devstoreaccount1", self.port))
            .expect("a loopback URL parses")
    }

    pub fn start() -> Azurite {
        let bin = azurite_bin();
        let mut last_error = String::new();
        // The port is free when we pick it; another process could take it before Azurite binds,
        // so try a few times.
        for _ in 0..3 {
            let port = free_port();
            match Self::spawn(&bin, port) {
                Ok(azurite) => return azurite,
                Err(e) => last_error = e,
            }
        }
        panic!("Azurite did not start: {last_error}");
    }

    fn spawn(bin: &PathBuf, port: u16) -> Result<Azurite, String> {
        let workdir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let mut child = Command::new(bin)
            .args([
                "--inMemoryPersistence",
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--loose",
                "--disableTelemetry",
                "--skipApiVersionCheck",
            ])
            // In-memory persistence refuses --location; the working directory catches any debug
            // or extent files instead.
            .current_dir(workdir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready_sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !ready_sent && line.contains("successfully listens on") {
                    let _ = tx.send(Ok(()));
                    ready_sent = true;
                }
                // Keep draining so Azurite never blocks on a full pipe.
            }
            if !ready_sent {
                let _ = tx.send(Err("Azurite exited before it was ready".to_string()));
            }
        });
        if let Some(stderr) = child.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("azurite: {line}");
                }
            });
        }
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => Ok(Azurite {
                child,
                port,
                _workdir: workdir,
            }),
            Ok(Err(e)) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err("no `successfully listens on` within 60 s".to_string())
            }
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local addr").port()
}

fn azurite_bin() -> PathBuf {
    let tools = std::env::var_os("STEMCELL_GALLERY_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools"));
    let bin = tools.join("node_modules/.bin/azurite-blob");
    assert!(
        bin.exists(),
        "Azurite is not installed at {}; run `bash scripts/test-tools.sh` (or scripts/test.sh), \
         or set STEMCELL_GALLERY_TOOLS to the directory holding node_modules/.bin/azurite-blob",
        bin.display()
    );
    bin
}
