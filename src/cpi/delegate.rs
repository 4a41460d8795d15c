//! Pass-through to the real Azure CPI: the same stdin bytes in, its stdout and exit status out.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Run `path` with `input` on its stdin; relay its stdout to ours unchanged (stderr is inherited).
/// Returns its exit code (1 if it died from a signal).
pub fn run(path: &Path, input: &[u8]) -> anyhow::Result<i32> {
    let mut child = Command::new(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run the delegate CPI {}: {e}; check --delegate points at the Azure CPI's bin/cpi and that it is executable", path.display()))?;
    // Feed stdin from a thread so a delegate that writes before reading cannot deadlock us.
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut out = std::io::stdout().lock();
    std::io::copy(&mut stdout, &mut out)?;
    out.flush()?;
    let status = child.wait()?;
    let _ = feeder.join();
    Ok(status.code().unwrap_or(1))
}
