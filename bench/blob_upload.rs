//! Throughput and memory of the page-blob uploader alone, against a fresh Azurite.
//!
//!     cargo run --release --example blob_upload_bench -- [VHD_MIB] [DATA_PERCENT] [CHUNK_KIB] [CONCURRENCY...]
//!
//! Defaults: 2048 MiB VHD, 25 % random data (1 MiB of data at the start of every 4 MiB when 25 %),
//! 64 KiB chunks from the producer, concurrency 1 4 8 16. The VHD is generated chunk by chunk
//! (never held in memory), so the peak RSS printed at the end is the pipeline's own.

#[path = "../tests/integration/support/azurite.rs"]
mod azurite;

use rand::{Rng, SeedableRng};
use stemcell_gallery::azure::blob::{
    delete_blob_if_exists, ensure_container, new_stemcell_blob_name, upload_page_blob, Progress,
    StorageAuth, StorageTarget, UploadOptions,
};
use stemcell_gallery::gallery::blob_store::{page_runs_sink, SinkError};
use tokio::sync::mpsc;

fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| -> usize {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let vhd_mib = arg(0, 2048);
    let percent = arg(1, 25).clamp(1, 100);
    let chunk = arg(2, 64) * 1024;
    let concurrencies: Vec<usize> = if args.len() > 3 {
        args[3..].iter().filter_map(|a| a.parse().ok()).collect()
    } else {
        vec![1, 4, 8, 16]
    };
    let size = (vhd_mib as u64) * 1024 * 1024 + 512;
    let data_per_4mib = 4 * 1024 * 1024 * percent / 100;

    let az = azurite::Azurite::start();
    let target = StorageTarget::new(&az.blob_endpoint(), StorageAuth::DevelopmentKey)
        .expect("Azurite endpoint");
    let container = target.container("stemcell");
    ensure_container(&container).await.expect("container");
    println!(
        "VHD {vhd_mib} MiB, {percent}% data, {} KiB chunks",
        chunk / 1024
    );
    for concurrency in concurrencies {
        let blob = container.blob_client(new_stemcell_blob_name().1);
        let (tx, rx) = mpsc::channel(8);
        let producer = tokio::task::spawn_blocking(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let mut sink = page_runs_sink(tx);
            let mut buf = vec![0u8; chunk];
            let mut at = 0u64;
            while at < size {
                let n = chunk.min((size - at) as usize);
                let piece = &mut buf[..n];
                piece.fill(0);
                // Data where (offset mod 4 MiB) < data_per_4mib, random bytes.
                let window = 4 * 1024 * 1024u64;
                let mut w = at - at % window;
                while w < at + n as u64 {
                    let start = w.max(at);
                    let end = (w + data_per_4mib as u64).min(at + n as u64);
                    if start < end {
                        let range = &mut piece[(start - at) as usize..(end - at) as usize];
                        rng.fill_bytes(range);
                        for s in range.chunks_mut(512) {
                            s[0] |= 1;
                        }
                    }
                    w += window;
                }
                sink(at, piece)?;
                at += n as u64;
            }
            Ok::<(), SinkError>(())
        });
        let opts = UploadOptions {
            concurrency,
            progress: Progress::None,
            ..UploadOptions::default()
        };
        let stats = upload_page_blob(&blob, size, rx, &opts)
            .await
            .expect("upload");
        producer.await.expect("join").expect("producer");
        println!(
            "concurrency {concurrency:>2}: {:.2} s, {} MiB sent in {} requests ({} retries), {:.0} MiB/s of data, {:.0} MiB/s of VHD",
            stats.seconds,
            stats.bytes_sent >> 20,
            stats.requests,
            stats.retries,
            stats.bytes_sent as f64 / 1_048_576.0 / stats.seconds,
            size as f64 / 1_048_576.0 / stats.seconds
        );
        delete_blob_if_exists(&blob).await.expect("delete");
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS of this process: {rss} MiB");
    }
}
